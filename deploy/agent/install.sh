#!/usr/bin/env bash
# Install or upgrade the Nodus node agent on a GPU host (Debian/Ubuntu/RHEL with systemd).
#
#   sudo ./install.sh --wheel ./dist/nodus_agent-0.1.0-py3-none-any.whl --find-links ./dist
#   sudo ./install.sh --wheel https://example.org/nodus/nodus_agent-0.1.0-py3-none-any.whl
#   ./install.sh --dry-run --wheel ./dist/nodus_agent-0.1.0-py3-none-any.whl
#
# Idempotent: every step checks first, so running it again upgrades the agent and changes nothing else.
# It never overwrites /etc/nodus/agent.toml or agent.env, and never restarts a running agent unless
# --restart is given (a restart stops the programs the agent runs; they are resumed elsewhere).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT=/
SERVICE_USER=nodus
PYTHON=python3
DRY_RUN=0
START=0
RESTART=0
NO_INDEX=0
WHEELS=()
FIND_LINKS=()
NKEY_SEED=""

VENV=/opt/nodus/venv
SHARE=/opt/nodus/share
ETC=/etc/nodus
STATE=/var/lib/nodus
UNIT=/etc/systemd/system/nodus-agent.service

usage() {
  cat <<'EOF'
Usage: install.sh --wheel PATH|URL [options]

  --wheel PATH|URL    the nodus-agent wheel (repeat for nodus-schema and nodus-kit if pip cannot
                      find them); build them with: uv build --all-packages --out-dir dist
  --find-links DIR    where pip looks for the other wheels (repeatable; a directory or URL)
  --no-index          do not use the package index: every wheel comes from --wheel/--find-links
  --python PATH       the Python 3.11+ that creates the virtual environment (default: python3)
  --nkey-seed FILE     this node's NATS nkey seed (agent-<node>.nk, from `python -m nodus_kit.permitting
                      generate --node <node>`): installed as /etc/nodus/agent.nk (0440 root:nodus) and
                      named in agent.env. The bus refuses an agent without one (ADR-0026)
  --user NAME         the service user (default: nodus)
  --root DIR          install under DIR instead of / (tests and staging: no user, no systemctl;
                      the virtual environment only works at DIR/opt/nodus/venv)
  --start             enable and start the agent now (default: enable only)
  --restart           restart a running agent to load an upgrade (stops the programs it runs)
  --dry-run           print what would be done, change nothing
  -h, --help          this text
EOF
}

die() { printf 'install.sh: %s\n' "$*" >&2; exit 2; }
note() { printf '%s\n' "$*"; }
run() {
  if [ "$DRY_RUN" = 1 ]; then
    printf 'would run: %s\n' "$*"
  else
    printf '+ %s\n' "$*"
    "$@"
  fi
}
# A path under --root.
at() { printf '%s%s' "${ROOT%/}" "$1"; }
on_host() { [ "$ROOT" = / ]; }

while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) [ $# -ge 2 ] || die "--wheel needs a path or URL"; WHEELS+=("$2"); shift 2 ;;
    --find-links) [ $# -ge 2 ] || die "--find-links needs a directory or URL"; FIND_LINKS+=("$2"); shift 2 ;;
    --no-index) NO_INDEX=1; shift ;;
    --python) [ $# -ge 2 ] || die "--python needs a path"; PYTHON="$2"; shift 2 ;;
    --user) [ $# -ge 2 ] || die "--user needs a name"; SERVICE_USER="$2"; shift 2 ;;
    --nkey-seed) [ $# -ge 2 ] || die "--nkey-seed needs a file"; NKEY_SEED="$2"; shift 2 ;;
    --root) [ $# -ge 2 ] || die "--root needs a directory"; ROOT="$2"; shift 2 ;;
    --start) START=1; shift ;;
    --restart) RESTART=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option $1" ;;
  esac
done

# -- checks (also in a dry run: a dry run that would fail should say so) ---------------------------------
[ ${#WHEELS[@]} -gt 0 ] || die "give --wheel PATH|URL: the nodus-agent wheel (uv build --all-packages --out-dir dist)"
for w in "${WHEELS[@]}"; do
  case "$w" in
    http://*|https://*) ;;
    *) [ -f "$w" ] || die "wheel $w: no such file" ;;
  esac
done
# The Nodus libraries beside a local agent wheel are installed from there, by path: PyPI has unrelated
# packages of the same names (nodus-schema 0.1.0 is one), which pip would otherwise take from the index.
for w in "${WHEELS[@]}"; do
  case "$w" in
    http://*|https://*) continue ;;
  esac
  [[ "$(basename "$w")" == nodus_agent-*.whl ]] || continue
  for lib in nodus_schema nodus_kit; do
    printf '%s\n' "${WHEELS[@]}" | grep -q "/${lib}-[^/]*\.whl$\|^${lib}-[^/]*\.whl$" && continue
    sibling="$(find "$(dirname "$w")" -maxdepth 1 -name "${lib}-*.whl" 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$sibling" ]; then
      note "wheel: using $sibling (beside the agent's wheel)"
      WHEELS+=("$sibling")
    fi
  done
done
if [ -n "$NKEY_SEED" ]; then
  [ -f "$NKEY_SEED" ] || die "--nkey-seed $NKEY_SEED: no such file"
  head -c 2 "$NKEY_SEED" | grep -q '^SU' || die "--nkey-seed $NKEY_SEED: not a user nkey seed (it starts with SU)"
fi
command -v "$PYTHON" >/dev/null || die "$PYTHON not found: install Python 3.11+ or pass --python"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
  die "$PYTHON is older than 3.11: pass --python with a newer one"
if on_host && [ "$DRY_RUN" = 0 ] && [ "$(id -u)" != 0 ]; then
  die "run as root (sudo), or try --dry-run first"
fi
if ! on_host; then
  [ -d "$ROOT" ] || die "--root $ROOT: no such directory"
fi
note "installing the Nodus node agent into ${ROOT} (user ${SERVICE_USER})$([ "$DRY_RUN" = 1 ] && echo ', dry run')"

# -- the service user ---------------------------------------------------------------------------------------
if ! on_host; then
  note "user: skipped under --root (create ${SERVICE_USER} in the image)"
elif id -u "$SERVICE_USER" >/dev/null 2>&1; then
  note "user: ${SERVICE_USER} exists"
else
  run useradd --system --user-group --home-dir "$STATE" --no-create-home \
    --shell /usr/sbin/nologin --comment "Nodus node agent" "$SERVICE_USER"
fi
# The docker runtime talks to the Docker socket, which the docker group may use.
if on_host && getent group docker >/dev/null 2>&1; then
  if id -nG "$SERVICE_USER" 2>/dev/null | tr ' ' '\n' | grep -qx docker; then
    note "user: ${SERVICE_USER} is in group docker"
  else
    run usermod -aG docker "$SERVICE_USER"
  fi
fi

# -- directories ----------------------------------------------------------------------------------------
owned() {  # install -d with an owner on the host, without one under --root
  local mode="$1" owner="$2" group="$3" dir="$4"
  if on_host; then
    run install -d -m "$mode" -o "$owner" -g "$group" "$(at "$dir")"
  else
    run install -d -m "$mode" "$(at "$dir")"
  fi
}
owned 0755 root root /opt/nodus
owned 0755 root root "$SHARE"
owned 0750 root "$SERVICE_USER" "$ETC"
owned 0750 "$SERVICE_USER" "$SERVICE_USER" "$STATE"
owned 0750 "$SERVICE_USER" "$SERVICE_USER" "$STATE/agent"

# -- the virtual environment and the agent -------------------------------------------------------------
if [ -x "$(at "$VENV")/bin/python" ]; then
  note "venv: $(at "$VENV") exists"
else
  run "$PYTHON" -m venv "$(at "$VENV")"
fi
pip_args=(install --upgrade --disable-pip-version-check)
[ "$NO_INDEX" = 1 ] && pip_args+=(--no-index)
for link in "${FIND_LINKS[@]+"${FIND_LINKS[@]}"}"; do pip_args+=(--find-links "$link"); done
run "$(at "$VENV")/bin/pip" "${pip_args[@]}" "${WHEELS[@]}"
# Again, the given wheels alone and by force: a rebuilt wheel keeps its version (0.1.0 until a release),
# and pip skips a version it has, so without this an upgrade would keep the old code.
run "$(at "$VENV")/bin/pip" install --force-reinstall --no-deps --disable-pip-version-check "${WHEELS[@]}"
verify=(-c 'import nodus_schema.quantities, nodus_kit.servicing, nodus_agent.configuring')
if [ "$DRY_RUN" = 1 ]; then
  note "would check: $(at "$VENV")/bin/python ${verify[*]}"
elif ! "$(at "$VENV")/bin/python" "${verify[@]}"; then
  die "the installed nodus-schema or nodus-kit is not Nodus's (a package of the same name from the index?):
  pass every Nodus wheel with --wheel (nodus_agent, nodus_kit, nodus_schema), or use --no-index --find-links"
fi

# -- files ---------------------------------------------------------------------------------------------------
UNIT_CHANGED=0
if cmp -s "$HERE/nodus-agent.service" "$(at "$UNIT")"; then
  note "unit: $(at "$UNIT") is current"
else
  UNIT_CHANGED=1
  run install -D -m 0644 "$HERE/nodus-agent.service" "$(at "$UNIT")"
fi
# The example is refreshed on every run (it shows the keys of this version); the config never is.
run install -m 0644 "$HERE/agent.toml.example" "$(at "$ETC")/agent.toml.example"
conf_mode=(-m 0640)
on_host && conf_mode+=(-o root -g "$SERVICE_USER")
if [ -e "$(at "$ETC")/agent.toml" ]; then
  note "config: $(at "$ETC")/agent.toml exists, kept"
else
  run install "${conf_mode[@]}" "$HERE/agent.toml.example" "$(at "$ETC")/agent.toml"
fi
if [ -e "$(at "$ETC")/agent.env" ]; then
  note "config: $(at "$ETC")/agent.env exists, kept"
else
  run install "${conf_mode[@]}" /dev/null "$(at "$ETC")/agent.env"
fi
if [ -n "$NKEY_SEED" ]; then
  seed_mode=(-m 0440)
  on_host && seed_mode+=(-o root -g "$SERVICE_USER")
  run install "${seed_mode[@]}" "$NKEY_SEED" "$(at "$ETC")/agent.nk"
  if ! grep -q '^NODUS_NATS_NKEY_SEED=' "$(at "$ETC")/agent.env" 2>/dev/null; then
    if [ "$DRY_RUN" = 1 ]; then
      note "would add NODUS_NATS_NKEY_SEED=$ETC/agent.nk to $(at "$ETC")/agent.env"
    else
      printf 'NODUS_NATS_NKEY_SEED=%s\n' "$ETC/agent.nk" >> "$(at "$ETC")/agent.env"
      note "config: NODUS_NATS_NKEY_SEED=$ETC/agent.nk added to $(at "$ETC")/agent.env"
    fi
  fi
elif ! grep -q '^NODUS_NATS_NKEY_SEED=' "$(at "$ETC")/agent.env" 2>/dev/null; then
  note "credential: none yet. The bus refuses an agent without one: run again with --nkey-seed FILE,"
  note "            or set nats.nkey_seed in $ETC/agent.toml (deploy/nats/README.md)"
fi
run install -m 0644 "$HERE/README.md" "$(at "$SHARE")/README.md"
run install -m 0755 "$HERE/gpu-check.sh" "$(at "$SHARE")/gpu-check.sh"

# -- check the settings as the agent will read them ---------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
  note "would run: $(at "$VENV")/bin/nodus-agent --config $(at "$ETC")/agent.toml --check"
elif ! "$(at "$VENV")/bin/nodus-agent" --config "$(at "$ETC")/agent.toml" --check >/dev/null; then
  note "config: $(at "$ETC")/agent.toml does not validate yet (the message is above): edit it, then"
  note "        $VENV/bin/nodus-agent --config $ETC/agent.toml --check"
fi

# -- systemd ---------------------------------------------------------------------------------------------------
if ! on_host; then
  note "systemd: skipped under --root"
elif [ ! -d /run/systemd/system ]; then
  note "systemd: not running here; start $VENV/bin/nodus-agent --config $ETC/agent.toml yourself"
else
  [ "$UNIT_CHANGED" = 1 ] && run systemctl daemon-reload
  run systemctl enable nodus-agent.service
  if [ "$RESTART" = 1 ]; then
    run systemctl restart nodus-agent.service
  elif [ "$START" = 1 ]; then
    run systemctl start nodus-agent.service
  elif systemctl is-active --quiet nodus-agent.service; then
    note "systemd: the agent runs the old version until: systemctl restart nodus-agent"
  fi
fi

note "done. Next: edit $ETC/agent.toml (node, offering, region), check it with"
note "  $VENV/bin/nodus-agent --config $ETC/agent.toml --check"
note "then: systemctl enable --now nodus-agent; journalctl -u nodus-agent -f"
