#!/bin/bash
# Shows what an operator sees on a terminal during `modelctl deploy NAME --wait`: runs it in a
# detached tmux session of a fixed size, prints `tmux capture-pane -p` snapshots while it runs
# (each one that differs from the one before) and always the final screen, then exits with
# modelctl's exit status.
#
#   scripts/capture-deploy.sh [-s COLSxROWS] [-i SECONDS] [-a] SOCKET NAME
#
#   SOCKET   modeld's control socket (passed to modelctl --socket)
#   NAME     the model to deploy
#   -s       the terminal's size (default 100x30)
#   -i       seconds between snapshots (default 1)
#   -a       deploy with --allow-downtime
#
# modelctl is $MODELCTL, else the one on PATH. Needs tmux. The session runs on a private tmux
# server (-L), so it neither sees nor touches the user's sessions, and inherits this
# environment (NO_COLOR, MODELD_SOCKET, ...).
set -euo pipefail

size=100x30
interval=1
downtime=()
usage() { sed -n '5,11s/^# \{0,1\}//p' "$0" >&2; exit 2; }
while getopts "s:i:ah" opt; do
    case $opt in
        s) size=$OPTARG ;;
        i) interval=$OPTARG ;;
        a) downtime=(--allow-downtime) ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $# -eq 2 ]] || usage
socket=$1 name=$2
[[ $size =~ ^([0-9]+)x([0-9]+)$ ]] || { echo "capture-deploy: bad size $size (want COLSxROWS)" >&2; exit 2; }
cols=${BASH_REMATCH[1]} rows=${BASH_REMATCH[2]}
command -v tmux >/dev/null || { echo "capture-deploy: tmux is not installed (apt-get install tmux)" >&2; exit 2; }
modelctl=$(command -v "${MODELCTL:-modelctl}") || { echo "capture-deploy: no modelctl (set MODELCTL)" >&2; exit 2; }

work=$(mktemp -d)
server=capture-deploy-$$
cleanup() {
    tmux -L "$server" kill-server 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The pane runs modelctl, records its exit status, and then stays open so that the final
# screen can still be captured.
printf '%q ' "$modelctl" --socket "$socket" deploy "$name" --wait "${downtime[@]}" > "$work/cmd"
cat > "$work/run" <<EOF
$(cat "$work/cmd")
echo \$? > "$work/rc.tmp" && mv "$work/rc.tmp" "$work/rc"
exec tail -f /dev/null
EOF
tmux -L "$server" -f /dev/null new-session -d -s capture -x "$cols" -y "$rows" "bash $(printf %q "$work/run")"

capture() { tmux -L "$server" capture-pane -p -t capture; }
show() {
    # (Command substitution has already dropped the pane's empty rows below the output.)
    printf -- '--- %s, %sx%s: %s\n%s\n' "$1" "$cols" "$rows" "$(cat "$work/cmd")" "$2"
}

last=""
n=0
while [[ ! -e $work/rc ]]; do
    screen=$(capture)
    if [[ $screen != "$last" ]]; then
        n=$((n + 1))
        show "capture $n at $(date +%T)" "$screen"
        last=$screen
    fi
    # Wait for the next snapshot, or less when modelctl ends first.
    for ((t = 0; t < 10; t++)); do
        [[ -e $work/rc ]] && break
        sleep "$(awk -v i="$interval" 'BEGIN { print i / 10 }')"
    done
done
rc=$(cat "$work/rc")
# tmux draws what modelctl wrote a moment after it exits: wait until the screen holds still.
screen=$(capture)
for ((t = 0; t < 20; t++)); do
    sleep 0.1
    next=$(capture)
    [[ $next == "$screen" ]] && break
    screen=$next
done
show "final capture at $(date +%T), modelctl exited $rc" "$screen"
exit "$rc"
