#!/bin/sh
# Starts the MCP reference filesystem server (pinned in npm/server-filesystem,
# installed by `cargo xtask setup` into $FOREIGN_DIR) over stdio, allowed
# to work in DIR… (created when missing). It makes no network calls.
#   server-filesystem.sh DIR [DIR…]
set -eu
[ $# -gt 0 ] || { echo "usage: server-filesystem.sh DIR [DIR…]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
foreign=${FOREIGN_DIR:-$here/../../target/foreign}
entry=$foreign/server-filesystem/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js
[ -f "$entry" ] || { echo "server-filesystem is not installed at $entry: run cargo xtask setup" >&2; exit 127; }
mkdir -p "$@"
exec node "$entry" "$@"
