#!/bin/sh
# Starts Microsoft's Playwright MCP server (pinned in npm/playwright-mcp,
# installed by `cargo xtask setup` into $FOREIGN_DIR) over stdio, on
# Debian's chromium: headless, isolated (a fresh profile per session), no
# browser download, Chromium's background networking off, every host name
# unresolvable (tests name the local upstream by address), its files (page
# snapshots, console logs, screenshots, PDFs) under STATE_DIR/out.
#   playwright-mcp.sh STATE_DIR     (STATE_DIR becomes its $HOME)
set -eu
state=${1:?usage: playwright-mcp.sh STATE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
foreign=${FOREIGN_DIR:-$here/../../target/foreign}
entry=$foreign/playwright-mcp/node_modules/@playwright/mcp/cli.js
[ -f "$entry" ] || { echo "@playwright/mcp is not installed at $entry: run cargo xtask setup" >&2; exit 127; }
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "no chromium at $chromium: apt-get install chromium" >&2; exit 127; }
mkdir -p "$state/out"
cat > "$state/config.json" <<JSON
{"browser": {"browserName": "chromium", "isolated": true,
  "launchOptions": {"executablePath": "$chromium", "headless": true, "chromiumSandbox": false,
    "args": ["--disable-background-networking", "--disable-component-update", "--disable-domain-reliability",
             "--no-pings", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.*"]}},
 "outputDir": "$state/out"}
JSON
cd "$state"
exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$state" LANG=C.UTF-8 \
  node "$entry" --config "$state/config.json" --headless --isolated --no-sandbox \
  --executable-path "$chromium" --output-dir "$state/out" --viewport-size 1280x720 \
  --caps pdf --file-paths absolute
