#!/bin/sh
# Make the keys and credentials of a squall cluster on Kubernetes into DIR (default: the dev
# overlay's keys/, which its secretGenerator reads). Nothing here is ever committed: each
# install has its own keys. Needs `squall` (pip install 'squall[server]'; SQUALL=... to use
# another command) and NODES data-node pod names squall-data-0 ... (default 6).
#
#   DIR/cluster-key               the cluster key (payload tokens, receipts): master + nodes
#   DIR/auth-key                  the Ed25519 private auth key: the master only (it mints)
#   DIR/auth-public-key           its public half: the data nodes (they only verify)
#   DIR/node-credentials/<pod>    one node credential per data-node pod (NODE_TTL, 90d)
#   DIR/monitor-credential        a monitor credential for Prometheus (MONITOR_TTL, 1y)
set -eu
DIR=${1:-$(dirname "$0")/overlays/dev/keys}
NODES=${NODES:-6}
NODE_TTL=${NODE_TTL:-90d}
MONITOR_TTL=${MONITOR_TTL:-1y}
SQUALL=${SQUALL:-squall}
umask 077
mkdir -p "$DIR/node-credentials"
[ -s "$DIR/cluster-key" ] || $SQUALL auth keygen --cluster "$DIR/cluster-key" >/dev/null
[ -s "$DIR/auth-key" ] || $SQUALL auth keygen "$DIR/auth-key" >/dev/null
$SQUALL auth pubkey "$DIR/auth-key" > "$DIR/auth-public-key"
i=0
while [ "$i" -lt "$NODES" ]; do
  f="$DIR/node-credentials/squall-data-$i"
  [ -s "$f" ] || $SQUALL auth mint --role node --node "squall-data-$i" --ttl "$NODE_TTL" \
    --key-file "$DIR/auth-key" > "$f"
  i=$((i + 1))
done
[ -s "$DIR/monitor-credential" ] || $SQUALL auth mint --role monitor --ttl "$MONITOR_TTL" \
  --key-file "$DIR/auth-key" > "$DIR/monitor-credential"
echo "keys and credentials in $DIR"
