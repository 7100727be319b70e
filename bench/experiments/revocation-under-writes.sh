#!/bin/bash
# How long a token revoked on node A (DELETE /oauth2_tokens/{id}) keeps working on node B, while A
# takes 150 token writes a second (oha): two nodes on one PostgreSQL, B learning of changes only
# by NOTIFY (its poll 600 s away); twelve revocations at random moments; then a token written
# on A after B cached it as unknown. Usage: [BIN=path] bench/experiments/revocation-under-writes.sh
# (needs postgresql, oha, python3, curl; ports 8100, 8101, 8200, 8201, 9009, 55441 free)
source "$(dirname "$0")/../lib.sh"
BIN=${BIN:-$ROOT/target/release/turnpike}
W=$(mktemp -d /tmp/revocation.XXXX); chown postgres $W
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
runuser -u postgres -- $PGBIN/initdb -D $W/pg -U kong --auth=trust -E UTF8 --locale=C --no-sync >/dev/null
runuser -u postgres -- $PGBIN/postgres -D $W/pg -p 55441 -k $W -c listen_addresses=127.0.0.1 > $W/pg.log 2>&1 &
sleep 2
python3 -m http.server 9009 --directory /tmp >/dev/null 2>&1 &
UP=$!
export TURNPIKE_DATABASE=postgres TURNPIKE_PG_HOST=127.0.0.1 TURNPIKE_PG_PORT=55441 TURNPIKE_PG_USER=kong TURNPIKE_PG_DATABASE=postgres TURNPIKE_LOG_LEVEL=warn TURNPIKE_NGINX_WORKER_PROCESSES=1 TURNPIKE_DB_UPDATE_FREQUENCY=600
$BIN migrations bootstrap >/dev/null
TURNPIKE_PREFIX=$W/a TURNPIKE_PROXY_LISTEN=127.0.0.1:8100 TURNPIKE_ADMIN_LISTEN=127.0.0.1:8101 $BIN start > $W/a.log 2>&1 &
A=$!
TURNPIKE_PREFIX=$W/b TURNPIKE_PROXY_LISTEN=127.0.0.1:8200 TURNPIKE_ADMIN_LISTEN=127.0.0.1:8201 $BIN start > $W/b.log 2>&1 &
B=$!
for i in $(seq 50); do curl -sf localhost:8101/ >/dev/null && curl -sf localhost:8201/ >/dev/null && break; sleep 0.2; done
oauth2_setup http://127.0.0.1:8101 http://127.0.0.1:9009
post() { curl -sf -X POST "localhost:8101$1" -H 'content-type: application/json' -d "$2"; }
for i in $(seq 0 11); do post /oauth2_tokens "{\"credential\":{\"id\":\"$CRED\"},\"service\":{\"id\":\"$SVC\"},\"access_token\":\"hand-token-$i\",\"expires_in\":7200}" > /dev/null; done
sleep 0.5
for i in $(seq 0 11); do echo -n "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer hand-token-$i" localhost:8200/o/) "; done; echo
# stream of token writes on A at 150/s
oha --no-tui --output-format json -c 8 -q 150 -z 8s -m POST -T application/json -d "{\"credential\":{\"id\":\"$CRED\"},\"service\":{\"id\":\"$SVC\"},\"expires_in\":7200}" http://127.0.0.1:8101/oauth2_tokens > $W/oha.json &
OHA=$!
sleep 2
python3 - <<'PY'
import sys, time, urllib.request, random
for i in range(12):
  time.sleep(random.uniform(0.05, 0.4))
  req = urllib.request.Request(f"http://127.0.0.1:8101/oauth2_tokens/hand-token-{i}", method="DELETE")
  t0 = time.time(); urllib.request.urlopen(req).read()
  while True:
    r = urllib.request.Request("http://127.0.0.1:8200/o/", headers={"Authorization": f"Bearer hand-token-{i}"})
    try:
        urllib.request.urlopen(r).read(); code = 200
    except urllib.error.HTTPError as e:
        code = e.code; body = e.read()
    if code == 401:
        print(f"revoked on B after {1000*(time.time()-t0):.1f} ms: {code}"); break
    if time.time() - t0 > 5: print("still", code); break
    time.sleep(0.001)
PY
wait $OHA
python3 -c "import json;d=json.load(open('$W/oha.json'));print('writes', d['statusCodeDistribution'])"
# a new token written on A works on B at once (negative entry dropped): look it up first on B
echo "B unknown: $(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer later-token' localhost:8200/o/)"
post /oauth2_tokens "{\"credential\":{\"id\":\"$CRED\"},\"service\":{\"id\":\"$SVC\"},\"access_token\":\"later-token\",\"expires_in\":7200}" >/dev/null
python3 - <<'PY'
import time, urllib.request
t0=time.time()
while True:
    r = urllib.request.Request("http://127.0.0.1:8200/o/", headers={"Authorization": "Bearer later-token"})
    try:
        urllib.request.urlopen(r).read(); print(f"new token on B after {1000*(time.time()-t0):.1f} ms"); break
    except urllib.error.HTTPError as e:
        if time.time()-t0 > 5: print("still", e.code); break
    time.sleep(0.001)
PY
echo "B http1.0: $(curl -s --http1.0 -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer later-token' localhost:8200/o/)"
kill $A $B $UP; sleep 0.5; pkill -u postgres postgres
rm -rf "$W"
