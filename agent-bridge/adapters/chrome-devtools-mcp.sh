#!/bin/sh
# Starts Google's Chrome DevTools MCP server (pinned in
# npm/chrome-devtools-mcp, installed by `cargo xtask setup` into
# $FOREIGN_DIR) over stdio, on Debian's chromium, with every path by which
# it phones home switched off: its npm update check (an environment
# variable is the only switch), usage statistics, CrUX lookups of page URLs;
# Chromium's background networking off and every host name unresolvable.
# Pages are addressed as the selected one (--no-page-id-routing).
#   chrome-devtools-mcp.sh STATE_DIR     (STATE_DIR becomes its $HOME)
set -eu
state=${1:?usage: chrome-devtools-mcp.sh STATE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
foreign=${FOREIGN_DIR:-$here/../../target/foreign}
entry=$foreign/chrome-devtools-mcp/node_modules/chrome-devtools-mcp/build/src/bin/chrome-devtools-mcp.js
[ -f "$entry" ] || { echo "chrome-devtools-mcp is not installed at $entry: run cargo xtask setup" >&2; exit 127; }
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "no chromium at $chromium: apt-get install chromium" >&2; exit 127; }
mkdir -p "$state"
cd "$state"
exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$state" LANG=C.UTF-8 \
  CHROME_DEVTOOLS_MCP_NO_UPDATE_CHECKS=1 CHROME_DEVTOOLS_MCP_NO_USAGE_STATISTICS=1 \
  node "$entry" --headless --isolated --executablePath="$chromium" \
  --no-usage-statistics --no-performance-crux --no-page-id-routing --viewport 1280x720 \
  --chromeArg=--no-sandbox --chromeArg=--disable-background-networking \
  --chromeArg=--disable-component-update --chromeArg=--no-pings \
  '--chromeArg=--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.*'
