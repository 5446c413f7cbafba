#!/usr/bin/env bash
# The real OpenStack CLI with the Ironic Inspector plugin, in a venv (Debian's python3 and
# python3-venv; the packages from the Python package registry, pinned), for the compatibility
# test appliance/tests/openstack_cli.rs. Prints the venv's bin directory. Idempotent: a venv
# that already has these versions is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${OPENSTACK_VENV:-$PWD/target/openstack-venv}
PINS=(python-openstackclient==10.5.0 python-ironic-inspector-client==5.4.0)
stamp="$VENV/.paddock-pins"
if [[ ! -x $VENV/bin/openstack || "$(cat "$stamp" 2>/dev/null)" != "${PINS[*]}" ]]; then
  [[ -x /usr/bin/python3 ]] || { echo "openstack-venv: /usr/bin/python3 missing: run scripts/install-deps.sh" >&2; exit 1; }
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" \
    || { echo "openstack-venv: python3 -m venv failed: run scripts/install-deps.sh (python3-venv)" >&2; exit 1; }
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PINS[@]}" >&2
  echo "${PINS[*]}" >"$stamp"
fi
echo "$VENV/bin"
