"""Config.load's precedence (pure: explicit environ, cwd, config file and home; no server)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from nodus_sdk import Config, ConfigError, Context, read_config_file, write_context

CONFIG = """\
current-context: staging
contexts:
  - name: staging
    server: https://staging.example.com/
    token: staging-token
    project: vision
    ca: certs/staging.crt
  - name: prod
    server: https://prod.example.com
    token: prod-token
    project: nlp
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".config" / "nodus").mkdir(parents=True)
    (home / ".config" / "nodus" / "config.yaml").write_text(CONFIG)
    return home


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A checkout with .nodus/local.env as `make up` writes it, and a directory deep inside it."""
    root = tmp_path / "checkout"
    (root / ".nodus").mkdir(parents=True)
    (root / ".nodus" / "local.env").write_text(
        "NODUS_URL=https://127.0.0.1:8443\nNODUS_TOKEN=local-token\nNODUS_CA=.nodus/ca.crt\n"
    )
    (root / "src" / "deep").mkdir(parents=True)
    return root / "src" / "deep"


def load(home: Path, cwd: Path, environ: dict[str, str] | None = None, **given: str) -> Config:
    return Config.load(environ=environ or {}, cwd=cwd, home=home, **given)  # type: ignore[arg-type]


def test_the_config_files_current_context(home: Path, tmp_path: Path) -> None:
    c = load(home, tmp_path)
    assert (c.server, c.token, c.project) == ("https://staging.example.com", "staging-token", "vision")
    assert c.ca == str(home / ".config" / "nodus" / "certs" / "staging.crt")  # relative to the file
    assert c.sources["server"] == str(home / ".config" / "nodus" / "config.yaml")


def test_another_context_by_name_or_environment(home: Path, tmp_path: Path) -> None:
    assert load(home, tmp_path, context="prod").token == "prod-token"
    c = load(home, tmp_path, {"NODUS_CONTEXT": "prod"})
    assert (c.server, c.project, c.ca) == ("https://prod.example.com", "nlp", None)
    with pytest.raises(ConfigError, match="no context named 'nope'"):
        load(home, tmp_path, context="nope")


def test_the_environment_beats_the_file_and_arguments_beat_both(home: Path, tmp_path: Path) -> None:
    env = {"NODUS_PROJECT": "from-env", "NODUS_TOKEN": "env-token"}
    c = load(home, tmp_path, env)
    assert (c.project, c.token, c.sources["project"]) == ("from-env", "env-token", "environment")
    c = load(home, tmp_path, env, project="from-arg", token="arg-token")
    assert (c.project, c.token, c.sources["token"]) == ("from-arg", "arg-token", "argument")
    # NODUS_NAMESPACE is the same setting under kubectl's word; NODUS_PROJECT wins.
    assert load(home, tmp_path, {"NODUS_NAMESPACE": "ns"}).project == "ns"
    assert load(home, tmp_path, {"NODUS_NAMESPACE": "ns", "NODUS_PROJECT": "p"}).project == "p"


def test_a_files_token_and_ca_go_only_to_its_own_server(home: Path, checkout: Path) -> None:
    c = load(home, checkout, {"NODUS_URL": "https://elsewhere.example.com"})
    assert (c.server, c.token, c.ca) == ("https://elsewhere.example.com", None, None)
    # The context's server again (the trailing slash does not matter): its token comes back.
    c = load(home, checkout, {"NODUS_URL": "https://staging.example.com"})
    assert c.token == "staging-token"
    # local.env's token goes with local.env's URL.
    c = load(home, checkout, server="https://127.0.0.1:8443")
    assert (c.token, c.ca) == ("local-token", str(checkout.parent.parent / ".nodus" / "ca.crt"))


def test_local_env_comes_last_and_is_found_upwards(checkout: Path, tmp_path: Path) -> None:
    nobody = tmp_path / "empty-home"
    c = load(nobody, checkout)
    assert (c.server, c.token, c.project) == ("https://127.0.0.1:8443", "local-token", "default")
    assert c.local_env == checkout.parent.parent / ".nodus" / "local.env"
    bare = load(nobody, tmp_path / "nowhere")
    assert (bare.server, bare.token, bare.project, bare.sources["server"]) == (
        "http://127.0.0.1:8440",
        None,
        "default",
        "default",
    )


def test_nodus_config_names_the_file(home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("current-context: x\ncontexts: [{name: x, server: 'http://x:1', project: px}]\n")
    c = load(home, tmp_path, {"NODUS_CONFIG": str(other)})
    assert (c.server, c.project) == ("http://x:1", "px")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("- a list", "expected a mapping"),
        ("contexts: {name: x}", "contexts must be a list"),
        ("contexts: [{server: x}]", "must be a mapping with a name"),
        ("contexts: [{name: x, token: 5}]", "token must be a string"),
        ("{unclosed", "not YAML"),
    ],
)
def test_a_bad_file_says_what_is_wrong(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        read_config_file(path)


def test_write_context_keeps_the_others_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "nodus" / "config.yaml"
    write_context(path, Context(name="a", server="http://a:1", token="ta"))
    written = write_context(path, Context(name="b", server="http://b:1", project="pb"), make_current=False)
    assert written.current_context == "a" and [c.name for c in written.contexts] == ["a", "b"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    back = read_config_file(path)
    assert back == written and back.context("b") == Context(name="b", server="http://b:1", project="pb")
    assert Config.load(environ={"NODUS_CONFIG": str(path)}, cwd=tmp_path).token == "ta"


def test_client_arguments_override_a_given_config() -> None:
    from nodus_sdk import Client

    base = Config(server="http://a:1", token="t", project="p")
    with Client(base, project="q", server="http://b:2/") as c:
        assert (c.server, c.project, c.config.token) == ("http://b:2", "q", "t")
    with Client(base) as c:
        assert c.config is base
