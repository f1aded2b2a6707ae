// Values as the CLI prints them. Money is the API's decimal strings, shown as they are; where an amount must
// be compared (the spend against the cap) it is read into BigInt micro-dollars.

export const NONE = "-";

export const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);

export function usd(amount) {
  // The API's decimal string as it is: a float could print 0.30000000000000004.
  return amount ? `$${amount}` : NONE;
}

export function wall(seconds) {
  if (seconds === null || seconds === undefined) return NONE;
  const hours = Math.floor(seconds / 3600);
  const minutes = Math.floor((seconds % 3600) / 60);
  const secs = seconds % 60;
  const two = (n) => String(n).padStart(2, "0");
  if (hours) return `${hours}h${two(minutes)}m${two(secs)}s`;
  if (minutes) return `${minutes}m${two(secs)}s`;
  return `${secs}s`;
}

export function age(timestamp) {
  const then = Date.parse(timestamp || "");
  if (Number.isNaN(then)) return NONE;
  const seconds = Math.max(0, Math.floor((Date.now() - then) / 1000));
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (seconds >= size) return `${Math.floor(seconds / size)}${unit}`;
  }
  return `${seconds}s`;
}

export function bytes(n) {
  if (n === null || n === undefined) return NONE;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let whole = n;
  while (whole >= 1024 && i < units.length - 1) {
    whole /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${whole.toFixed(1)} ${units[i]}`;
}

export function micros(amount) {
  // "1.55" -> 1550000n: exact, for comparing amounts; null for anything that is not a decimal string.
  const m = /^(\d+)(?:\.(\d{1,6}))?$/.exec(String(amount ?? "").trim());
  if (!m) return null;
  return BigInt(m[1]) * 1000000n + BigInt((m[2] || "").padEnd(6, "0"));
}

export function percent(permille) {
  return `${permille / 10n}.${permille % 10n}%`;
}

export function gpuOf(spec) {
  const gpu = spec && spec.resources && spec.resources.gpu;
  if (!gpu) return NONE;
  if (typeof gpu === "string") return gpu;
  const types = Array.isArray(gpu.type) ? gpu.type.join("|") : gpu.type;
  return `${types || "?"}:${gpu.count ?? 1}`;
}
