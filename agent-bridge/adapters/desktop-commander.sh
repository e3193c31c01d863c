#!/bin/sh
# Starts desktop-commander (pinned in npm/desktop-commander, installed by
# `cargo xtask setup` into $FOREIGN_DIR) over stdio, with every path by
# which it phones home switched off (see docs/FOREIGN.md): telemetry, the
# feature-flag fetch, the Chrome download, the welcome page.
#   desktop-commander.sh STATE_DIR     (STATE_DIR becomes its $HOME: config, logs)
set -eu
state=${1:?usage: desktop-commander.sh STATE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
foreign=${FOREIGN_DIR:-$here/../../target/foreign}
entry=$foreign/desktop-commander/node_modules/@wonderwhy-er/desktop-commander/dist/index.js
[ -f "$entry" ] || { echo "desktop-commander is not installed at $entry: run cargo xtask setup" >&2; exit 127; }
cfg=$state/.claude-server-commander
mkdir -p "$cfg/puppeteer-cache/chrome/offline/chrome-linux64"
# only its existence is checked: no background Chrome download
touch "$cfg/puppeteer-cache/chrome/offline/chrome-linux64/chrome"
if [ ! -f "$cfg/config.json" ]; then
  # every key written: a config it finds is not merged with its defaults
  cat > "$cfg/config.json" <<'JSON'
{"telemetryEnabled": false, "pendingWelcomeOnboarding": false, "welcomeOnboardingEligible": false,
 "onboarding_injection": false, "allowedDirectories": [], "fileReadLineLimit": 1000, "fileWriteLineLimit": 50,
 "defaultShell": "/bin/bash",
 "blockedCommands": ["mkfs","format","mount","umount","fdisk","dd","parted","diskpart","sudo","su","passwd","adduser","useradd","usermod","groupadd","chsh","visudo","shutdown","reboot","halt","poweroff","init","iptables","firewall","netsh","sfc","bcdedit","reg","net","sc","runas","cipher","takeown"]}
JSON
fi
exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$state" SHELL=/bin/bash LANG=C.UTF-8 \
  DESKTOP_COMMANDER_DISABLE_TELEMETRY=1 'DC_FLAG_URL=data:application/json,{"flags":{}}' \
  node "$entry" --no-onboarding
