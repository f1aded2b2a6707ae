"""The Sweep page in headless Chromium: the cell grid, the best cells (in the grid and on the chart), the
spend against the cap, live updates from the watch API, and a screenshot of it all.

The Sweep is created through the gateway and its status written into the ``sweeps`` bucket; the page reads
it through the API and follows the watch (``?watch=true&fieldSelector=metadata.name=...``), so a status
written while the page is open must show without a reload.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from selenium.webdriver.remote.webdriver import WebDriver

from .conftest import VIEWPORT, Gateway, open_page, wait_for
from .sweeps import CAP_USD, create_sweep, finished, running, write_status

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "ui-sweep.png"
UPDATE_REFERENCE = "NODUS_UPDATE_UI_SCREENSHOT"

# One round trip per look at the page: the page is redrawn on every watch event, so reading each cell
# through its own WebDriver call could mix two versions of the grid.
GRID_JS = """
return [...document.querySelectorAll('#cells tbody tr')].map(tr => ({
  index: Number(tr.dataset.index),
  phase: tr.dataset.phase,
  wall: tr.querySelector('.cell-wall').textContent,
  throughput: tr.querySelector('.cell-throughput').textContent,
  cost: tr.querySelector('.cell-cost').textContent,
  marks: [...tr.querySelectorAll('.mark')].map(m => m.className.replace('mark ', '')),
}));
"""
CHART_JS = """
const svg = document.getElementById('chart');
if (!svg) return null;
const index = (sel) => { const el = svg.querySelector(sel); return el ? Number(el.dataset.index) : null; };
return {
  dots: [...svg.querySelectorAll('circle.dot')].map(c => Number(c.dataset.index)).sort(),
  ringed: index('circle.mark-cost[data-index]'),
  crossed: index('path.mark-throughput[data-index]'),
};
"""
CAP_JS = """
const cap = document.getElementById('cap');
if (!cap) return null;
const track = cap.querySelector('.cap-track').getBoundingClientRect();
const fill = document.getElementById('cap-fill').getBoundingClientRect();
return {text: document.getElementById('cap-text').textContent, cls: cap.className,
        permille: cap.dataset.permille, share: fill.width / track.width};
"""


def grid(browser: WebDriver) -> dict[int, dict[str, Any]]:
    rows = browser.execute_script(GRID_JS)
    return {row["index"]: row for row in rows}


def chart(browser: WebDriver) -> dict[str, Any] | None:
    result: dict[str, Any] | None = browser.execute_script(CHART_JS)
    return result


def cap(browser: WebDriver) -> dict[str, Any] | None:
    result: dict[str, Any] | None = browser.execute_script(CAP_JS)
    return result


def live(browser: WebDriver) -> bool:
    return bool(browser.execute_script("return document.getElementById('live').dataset.state === 'live'"))


def test_the_sweep_page_shows_the_grid_best_cells_and_cap_and_follows_the_watch(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str
) -> None:
    create_sweep(api, unique, "lr")
    gateway.run(write_status(unique, "lr", running("lr")))

    open_page(browser, gateway, f"/sweeps/{unique}/lr")
    cells = wait_for(browser, lambda b: (g := grid(b)) and len(g) == 4 and g, "the grid's four cells")

    assert {i: c["phase"] for i, c in cells.items()} == {
        0: "Succeeded",
        1: "Failed",
        2: "Succeeded",
        3: "Running",
    }
    assert (cells[0]["wall"], cells[0]["throughput"], cells[0]["cost"]) == ("1m00s", "812.5", "$0.42")
    assert (cells[1]["throughput"], cells[1]["cost"]) == ("-", "$0.03")
    assert (cells[3]["wall"], cells[3]["cost"]) == ("-", "-")
    # The best cells, as the controller chose them: #2 by cost, #0 by throughput.
    assert {i: c["marks"] for i, c in cells.items() if c["marks"]} == {
        0: ["best-throughput"],
        2: ["best-cost"],
    }
    assert chart(browser) == {"dots": [0, 2], "ringed": 2, "crossed": 0}
    assert browser.find_element("id", "best-cost").get_attribute("data-index") == "2"
    assert browser.find_element("id", "best-throughput").get_attribute("data-index") == "0"

    bar = cap(browser)
    assert bar is not None
    assert bar["text"] == f"spent $0.76 of the ${CAP_USD} cap (38.0%)"
    assert (bar["permille"], bar["cls"]) == ("380", "cap")
    assert abs(bar["share"] - 0.38) < 0.01, bar

    # The page is following the watch; the controller writes the next status.
    wait_for(browser, live, "the watch to be open")
    gateway.run(write_status(unique, "lr", finished("lr")))

    def updated(b: WebDriver) -> dict[int, dict[str, Any]] | None:
        g = grid(b)
        return g if len(g) == 4 and g[3]["phase"] == "Succeeded" else None

    cells = wait_for(browser, updated, "cell 3 to turn Succeeded without a reload")
    # Money exactly as the API wrote it, never through a float; wall time as the CLI prints it.
    assert (cells[3]["wall"], cells[3]["throughput"], cells[3]["cost"]) == ("1h02m05s", "500", "$0.000177")
    assert {i: c["marks"] for i, c in cells.items() if c["marks"]} == {
        0: ["best-throughput"],
        3: ["best-cost"],
    }
    assert chart(browser) == {"dots": [0, 2, 3], "ringed": 3, "crossed": 0}
    bar = cap(browser)
    assert bar is not None
    assert bar["text"] == f"spent $1.900177 of the ${CAP_USD} cap (95.0%)"
    assert (bar["permille"], bar["cls"]) == ("950", "cap high")
    assert abs(bar["share"] - 0.95) < 0.01, bar
    assert "CellsFailed" in browser.find_element("css selector", "p.sub").text


def test_the_sweeps_list_links_to_the_sweep_page(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str
) -> None:
    create_sweep(api, unique, "lr")
    gateway.run(write_status(unique, "lr", running("lr")))

    open_page(browser, gateway, f"/sweeps/{unique}")
    row = wait_for(browser, lambda b: b.find_element("css selector", "#sweeps-table tr[data-name='lr']"))
    assert [td.text for td in row.find_elements("tag name", "td")][:8] == [
        unique,
        "lr",
        "Running",
        "3/4",
        "$0.76",
        f"${CAP_USD}",
        "#2",
        "#0",
    ]
    # The project selector offers the project shown.
    options = [o.get_attribute("value") for o in browser.find_elements("css selector", "#namespace option")]
    assert unique in options
    row.find_element("link text", "lr").click()
    wait_for(browser, lambda b: len(grid(b)) == 4, "the Sweep page from the list")
    assert browser.current_url.endswith(f"#/sweeps/{unique}/lr")


# ---------------------------------------------------------------------------------------------------------
# The screenshot
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Png:
    width: int
    height: int
    channels: int
    pixels: bytes  # rows of width * channels bytes, unfiltered

    def colours(self) -> Counter[bytes]:
        n = self.channels
        # Alpha is left out: a screenshot is opaque, and a colour is what is seen.
        return Counter(self.pixels[i : i + 3] for i in range(0, len(self.pixels), n))


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(data: bytes) -> Png:
    """A PNG as browsers write screenshots (8-bit RGB or RGBA, not interlaced, any row filter)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    at, chunks = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        tag, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, f"bad CRC on {tag!r}"
        chunks.append((tag, body))
        at += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    n = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(body for tag, body in chunks if tag == b"IDAT"))
    stride = width * n
    assert len(raw) == (stride + 1) * height
    out = bytearray()
    prev = bytearray(stride)
    for y in range(height):
        kind, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = row[x - n] if x >= n else 0
            up, up_left = prev[x], (prev[x - n] if x >= n else 0)
            predictor = (0, left, up, (left + up) // 2, _paeth(left, up, up_left))[kind]
            row[x] = (row[x] + predictor) & 0xFF
        out += row
        prev = row
    return Png(width, height, n, bytes(out))


def near(colours: Counter[bytes], rgb: tuple[int, int, int], within: int = 24) -> int:
    """How many pixels are within ``within`` of ``rgb`` on every channel."""
    return sum(count for c, count in colours.items() if all(abs(c[i] - rgb[i]) <= within for i in range(3)))


def test_a_screenshot_of_the_sweep_page(
    browser: WebDriver, gateway: Gateway, api: httpx.Client, unique: str, tmp_path: Path
) -> None:
    create_sweep(api, unique, "hash-bench")
    gateway.run(write_status(unique, "hash-bench", finished("hash-bench")))
    open_page(browser, gateway, f"/sweeps/{unique}/hash-bench")
    wait_for(browser, lambda b: (c := chart(b)) is not None and c["ringed"] == 3, "the chart's marks")
    wait_for(browser, live, "the watch to be open")

    shot = tmp_path / "ui-sweep.png"
    assert browser.save_screenshot(str(shot))
    png = decode_png(shot.read_bytes())
    assert (png.width, png.height) == VIEWPORT
    colours = png.colours()
    # Not blank: text, badges, the bar and the chart give many colours, and no colour fills the page.
    assert len(colours) >= 64, len(colours)
    assert colours.most_common(1)[0][1] < 0.9 * png.width * png.height
    # The page's own colours are there: Succeeded and Failed badges, the cap bar near the cap (amber), the
    # chart's ring (best by cost) and cross (best by throughput).
    for name, rgb in {
        "Succeeded badge": (0x1B, 0x7F, 0x3B),
        "Failed badge": (0xC0, 0x39, 0x2B),
        "cap bar, high": (0xB7, 0x79, 0x1F),
        "ring": (0x00, 0x8C, 0x46),
        "cross": (0xCC, 0x00, 0x00),
    }.items():
        assert near(colours, rgb) >= 20, f"no {name} on the screenshot"

    if os.environ.get(UPDATE_REFERENCE):
        REFERENCE.write_bytes(shot.read_bytes())
    # The docs' copy (docs/web.md shows it) is a screenshot of this same page: same size, and not blank.
    reference = decode_png(REFERENCE.read_bytes())
    assert (reference.width, reference.height) == VIEWPORT, (
        f"refresh it: {UPDATE_REFERENCE}=1 pytest {__file__}"
    )
    assert len(reference.colours()) >= 64
