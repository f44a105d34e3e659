#!/usr/bin/env bash
# gpumovectl against a real gpumoved: the commands of the README, their output and exit codes.
set -euo pipefail

RUNFILES="${TEST_SRCDIR:-$PWD/..}/gpumove"
GPUMOVED="$RUNFILES/daemon/gpumoved"
CTL="$RUNFILES/client/cli/gpumovectl"
WORK="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cli.XXXXXX")"
mkdir "$WORK/files"
"$GPUMOVED" --listen=127.0.0.1:0 --port_file="$WORK/addr" --node=cli-node \
  --host_pool_size=256MiB --pinned_pool_size=32MiB --file_roots="$WORK/files" \
  2>"$WORK/daemon.log" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null || true; wait $DAEMON 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$WORK/addr" ] && break; sleep 0.05; done
export GPUMOVE_ADDR="$(cat "$WORK/addr")"

fail() { echo "FAIL: $*"; cat "$WORK/daemon.log"; exit 1; }
expect_code() {  # expect_code CODE TEXT -- command...
  local want=$1 text=$2; shift 3
  set +e; out=$("$@" 2>&1); got=$?; set -e
  [ "$got" = "$want" ] || fail "'$*' exited $got, want $want: $out"
  [[ "$out" == *"$text"* ]] || fail "'$*' printed '$out', want '$text'"
}

"$CTL" info | grep -q "node      cli-node" || fail "info does not name the node"
"$CTL" info | grep -q "host pools only" || fail "info does not say host pools only"
"$CTL" --json info | grep -q '"node": "cli-node"' || fail "info --json"
# The GPU-NIC map from this machine's sysfs (here: no GPU or no RDMA device on PCI).
"$CTL" info | grep -qE "^gpu-nic   (GPU0 |[0-9]+ GPU\(s\), [0-9]+ RDMA device)" || fail "info has no gpu-nic line"
# Health (what container and Kubernetes probes ask): the server and each service.
expect_code 0 "SERVING" -- "$CTL" health
expect_code 0 "SERVING" -- "$CTL" health gpumove.v1.TransferService
expect_code 1 "NOT_FOUND" -- "$CTL" health no.such.Service

A=$("$CTL" alloc 3MiB)
B=$("$CTL" alloc 3MiB --kind pinned --lease 60s --label target)
[[ "$A" == b-* && "$B" == b-* ]] || fail "alloc printed '$A' '$B'"
"$CTL" ls | grep "$B" | grep -q "pinned.*3 MiB.*target" || fail "ls does not show $B"

head -c 3145728 /dev/urandom >"$WORK/in"
"$CTL" write "$A" "$WORK/in" 2>/dev/null
"$CTL" move "$A" "$B" --checksum | grep -q "SUCCEEDED" || fail "move did not succeed"
"$CTL" read "$B" "$WORK/out"
cmp -s "$WORK/in" "$WORK/out" || fail "bytes read back differ from bytes written"

# Offsets, lengths and stdin/stdout.
printf 'hello gpumove' | "$CTL" write "$B@1000" - 2>/dev/null
[ "$("$CTL" read "$B" - --offset 1000 --length 13)" = "hello gpumove" ] || fail "read at offset"
"$CTL" move "$B@1000" "$A@4KiB" --length 5 >/dev/null
[ "$("$CTL" read "cli-node/$A@4096" - --length 5)" = "hello" ] || fail "move with offsets"

ID=$("$CTL" move "$A" "$B" --no-wait)
[[ "$ID" == t-* ]] || fail "move --no-wait printed '$ID'"
"$CTL" wait "$ID" | grep -q SUCCEEDED || fail "wait"
"$CTL" transfer "$ID" | grep -q "$ID" || fail "transfer"
"$CTL" transfers | grep -c SUCCEEDED | grep -qx 3 || fail "transfers lists three moves"
"$CTL" transfers --state failed | grep -q "no transfers" || fail "transfers --state"
"$CTL" --json move "$A" "$B" | grep -q '"state": "SUCCEEDED"' || fail "move --json"
"$CTL" cancel "$ID" | grep -q SUCCEEDED || fail "cancel of a finished move changes nothing"

# A vectored move of blocks from a file: block 2 of A to block 0 of B, block 0 to block 3.
printf 'block-two!' | "$CTL" write "$A@8192" - 2>/dev/null
printf 'block-zero' | "$CTL" write "$A@0" - 2>/dev/null
printf '# src dst\n2 0\n0 3\n' > "$WORK/blocks"
"$CTL" move "$A" "$B" --blocks "$WORK/blocks" --block_size 4KiB --checksum | grep -q "2 pieces.*" \
  || fail "move --blocks"
[ "$("$CTL" read "$B" - --length 10)" = "block-two!" ] || fail "block 2 -> 0"
[ "$("$CTL" read "$B" - --offset 12288 --length 10)" = "block-zero" ] || fail "block 0 -> 3"
# The same blocks as a prepared list: kept, listed, named by a move, released.
printf 'zzzzzzzzzz' | "$CTL" write "$B@0" - 2>/dev/null
P=$("$CTL" prepare --blocks "$WORK/blocks" --block_size 4KiB --label kv)
[[ "$P" == p-*.cli-node ]] || fail "prepare printed '$P'"
"$CTL" prepared | grep "$P" | grep -qE " 2 +8 KiB .*kv$" || fail "prepared does not list $P"
"$CTL" move "$A" "$B" --prepared "$P" | grep -q "2 pieces" || fail "move --prepared"
[ "$("$CTL" read "$B" - --length 10)" = "block-two!" ] || fail "prepared block 2 -> 0"
# A file region as a buffer (issue 53): made under the root, moved into, bytes on disk.
F=$("$CTL" file ckpt/../ckpt.bin 4KiB --writable --create 2>&1) && fail "a path with .. was taken: $F"
[[ "$F" == *PERMISSION_DENIED* ]] || fail "the refusal of a path with ..: $F"
expect_code 2 "--create needs --writable" -- "$CTL" file new.bin 4KiB --create
F=$("$CTL" file ckpt.bin 1MiB --writable --create --label ckpt) || fail "file: $F"
"$CTL" ls | grep -q "^$F .* file .*ckpt" || fail "ls does not show the file buffer: $("$CTL" ls)"
out=$("$CTL" move "$A" "$F" --length 1MiB --checksum) || fail "move into the file: $out"
[[ "$out" == *SUCCEEDED*FILE_IO*"via io_uring"* || "$out" == *SUCCEEDED*FILE_IO*"via pread/pwrite"* ]] ||
  fail "move into the file: $out"
"$CTL" read "$A" "$WORK/a1m" --length 1MiB
cmp -s "$WORK/a1m" "$WORK/files/ckpt.bin" || fail "the file's bytes differ"
expect_code 2 "not both" -- "$CTL" move "$A" "$B" --prepared "$P" --blocks "$WORK/blocks" --block_size 4KiB
"$CTL" release-pieces "$P"
"$CTL" prepared | grep -q "no prepared piece lists" || fail "release-pieces"
expect_code 1 "NOT_FOUND: transfer 0: no prepared piece list" -- "$CTL" move "$A" "$B" --prepared "$P"
expect_code 1 "NOT_FOUND" -- "$CTL" release-pieces "$P"
expect_code 2 "prepare needs --blocks" -- "$CTL" prepare
# Notifications: a move with --notify, then the stream from the oldest kept.
"$CTL" move "$A" "$B" --notify "kv-ready 7" > /dev/null || fail "move --notify"
"$CTL" notifications --after 0 --count 1 | grep -q "kv-ready 7" || fail "notifications"
printf '1 x\n' > "$WORK/bad-blocks"
expect_code 2 "line 1" -- "$CTL" move "$A" "$B" --blocks "$WORK/bad-blocks" --block_size 4KiB

# Errors: the status code and message, non-zero exit, no stack trace.
expect_code 1 "NOT_FOUND: no buffer \"b-missing\"" -- "$CTL" release b-missing
expect_code 1 "INVALID_ARGUMENT" -- "$CTL" move "$A" "$B@1"
expect_code 1 "NOT_FOUND: unknown node" -- "$CTL" move "$A" "elsewhere/$B"
expect_code 1 "FAILED_PRECONDITION" -- "$CTL" alloc 1MiB --kind device
expect_code 2 "SIZE must be at least 1 byte" -- "$CTL" alloc 0
expect_code 1 "RESOURCE_EXHAUSTED: node cli-node: " -- "$CTL" alloc 255MiB
expect_code 1 "NOT_FOUND: no transfer" -- "$CTL" cancel t-missing
expect_code 1 "INVALID_ARGUMENT: duration" -- "$CTL" alloc 1MiB --lease 9000h
# A local file in a folder that does not exist is NOT_FOUND, not a refusal.
expect_code 1 "NOT_FOUND: $WORK/no-such-folder/out" -- "$CTL" read "$A" "$WORK/no-such-folder/out"
expect_code 1 "NOT_FOUND: $WORK/no-such-file" -- "$CTL" write "$A" "$WORK/no-such-file"
# Labels and other strings past their limits are refused with the field named.
expect_code 1 "INVALID_ARGUMENT: label has 300 bytes; at most 256" -- "$CTL" alloc 1MiB --label "$(printf 'l%.0s' $(seq 300))"
# CUDA IPC on a node without GPUs: refused with its code, nothing changes.
HANDLE=$(printf 'ab%.0s' $(seq 64))
expect_code 1 "FAILED_PRECONDITION: node cli-node has no GPU" -- "$CTL" import "$HANDLE" 1MiB --gpu_uuid GPU-x
expect_code 1 "FAILED_PRECONDITION: buffer \"$A\" is not device memory" -- "$CTL" export "$A"
expect_code 1 "NOT_FOUND" -- "$CTL" export b-missing
expect_code 2 "HANDLE_HEX must be" -- "$CTL" import abc 1MiB
expect_code 2 "SIZE lots: not a size" -- "$CTL" alloc lots
expect_code 2 "bad buffer reference" -- "$CTL" move "a/b/c" "$B"
expect_code 2 'no command "frobnicate"' -- "$CTL" frobnicate
expect_code 1 "UNAVAILABLE: cannot reach gpumoved" -- "$CTL" --addr 127.0.0.1:1 --timeout 200ms ls

# Help: exit 0 on stdout, a command's own flags and an example; usage errors exit 2 and
# say what was wrong (issue 50).
expect_code 0 "Commands:" -- "$CTL" --help
expect_code 0 "Commands:" -- "$CTL" -h
expect_code 0 "Commands:" -- "$CTL" help
for form in "help alloc" "alloc --help" "alloc -h"; do
  # shellcheck disable=SC2086  # The form splits on purpose.
  expect_code 0 "--exportable" -- "$CTL" $form
  "$CTL" $form | grep -q "^Example:" || fail "'$form' has no example"
  "$CTL" $form | grep -q -- "--checksum" && fail "'$form' lists another command's flags"
done
expect_code 0 "move SRC DST" -- "$CTL" --helpfull
expect_code 2 'no command "nope"' -- "$CTL" help nope
# The daemon's help: groups, exit 0, every flag in one of them.
expect_code 0 "pools (the memory it owns):" -- "$GPUMOVED" --help
expect_code 0 "  --device_pool_size " -- "$GPUMOVED" -h
"$GPUMOVED" --help | grep -q "^other" && fail "gpumoved --help leaves flags outside the groups"
expect_code 0 "(default 1GiB)" -- "$GPUMOVED" --helpfull
expect_code 2 "did you mean --length?" -- "$CTL" read "$A" - --lenght 5
expect_code 2 "--lease 30: not a duration with its unit" -- "$CTL" alloc 1MiB --lease 30
expect_code 2 "-5 is not a flag" -- "$CTL" alloc -5
expect_code 2 "too many arguments" -- "$CTL" get "$A" "$B"
set +e; "$CTL" >/dev/null 2>&1; [ $? = 2 ] || fail "no command should exit 2"; set -e

# --json: one document for every command, lists as arrays (empty ones too); text otherwise.
json() { /usr/bin/python3 -c 'import json, sys; d = json.load(sys.stdin); print(json.dumps(d))'; }
for cmd in "info" "health" "peers" "ls" "get $A" "transfers" "transfers --state failed" \
           "prepared" "transfer $ID" "wait $ID" "cancel $ID" "renew $B --lease 60s"; do
  # shellcheck disable=SC2086
  "$CTL" --json $cmd | json >/dev/null || fail "'$cmd --json' is not one JSON document"
done
"$CTL" --json peers | json | grep -q '"peers": \[\]' || fail "peers --json: no empty list"
"$CTL" --json prepared | json | grep -q '"lists": \[\]' || fail "prepared --json: no empty list"
"$CTL" --json transfers --state failed | json | grep -q '"transfers": \[\]' || fail "empty transfers"
"$CTL" --json health | json | grep -q '"status": "SERVING"' || fail "health --json"
"$CTL" --json read "$A" "$WORK/json-read" --length 100 | json | grep -q '"bytes_read": 100' \
  || fail "read --json"
printf 'x' | "$CTL" --json write "$A" - | json | grep -q '"bytes_written"' || fail "write --json"
X=$("$CTL" --json alloc 4KiB | json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
"$CTL" --json release "$X" | json | grep -q "\"released\": \"$X\"" || fail "release --json"
"$CTL" --json notifications --after 0 --count 1 | head -1 | json | grep -q '"sequence"' \
  || fail "notifications --json: one document a line"
"$CTL" get "$A" | grep -q '^ID ' || fail "get prints a table without --json"
"$CTL" get "$A" | grep -q '{' && fail "get prints JSON without --json"
# Tables: a header, a NODE column, human durations and rates.
"$CTL" ls | head -1 | grep -qE "^ID +NODE +KIND +SIZE" || fail "ls header"
"$CTL" ls | grep "$A" | grep -q " cli-node " || fail "ls has no NODE column"
"$CTL" transfers | head -1 | grep -qE "^ID +STATE +SOURCE +DESTINATION" || fail "transfers header"
"$CTL" transfer "$ID" | grep -qE " [0-9.]+ (us|ms|s) +[0-9.]+ (KiB|MiB|GiB)/s " \
  || fail "transfer: no human duration and rate"
"$CTL" transfer "$ID" | grep -qE "[0-9]\.[0-9]{4,}" && fail "transfer: more than 3 significant digits"

"$CTL" release "$A"
"$CTL" ls | grep -q "$A" && fail "released buffer still listed"

# A second daemon with bearer tokens and TLS: the CLI's credentials.
printf '# token,principal,tenant,role\ncli-token-0123456789,cli,team,user\n' >"$WORK/tokens"
printf 'cli-token-0123456789\n' >"$WORK/token"
SECURE_FLAGS=(--auth_tokens="$WORK/tokens")
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=cli-ca -keyout "$WORK/ca.key" -out "$WORK/ca.pem" >/dev/null 2>&1
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=cli \
    -keyout "$WORK/node.key" -out "$WORK/node.csr" >/dev/null 2>&1
  printf 'subjectAltName=IP:127.0.0.1\n' >"$WORK/ext"
  openssl x509 -req -in "$WORK/node.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
    -CAcreateserial -days 2 -extfile "$WORK/ext" -out "$WORK/node.pem" >/dev/null 2>&1
  SECURE_FLAGS+=(--tls_cert="$WORK/node.pem" --tls_key="$WORK/node.key")
  TLS=(--tls_ca "$WORK/ca.pem")
else
  echo "SKIPPED: the TLS half of the credentials check (no openssl command)"
  TLS=()
fi
"$GPUMOVED" --listen=127.0.0.1:0 --port_file="$WORK/addr2" --node=secure-node \
  --host_pool_size=64MiB --pinned_pool_size=16MiB "${SECURE_FLAGS[@]}" 2>"$WORK/daemon2.log" &
SECURE=$!
trap 'kill $DAEMON $SECURE 2>/dev/null || true; wait 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$WORK/addr2" ] && break; sleep 0.05; done
S=(--addr "$(cat "$WORK/addr2")" --timeout 2s)
expect_code 1 "GPUMOVE_TOKEN" -- "$CTL" "${S[@]}" "${TLS[@]}" ls  # UNAUTHENTICATED, with the hint.
expect_code 1 "UNAUTHENTICATED" -- "$CTL" "${S[@]}" "${TLS[@]}" ls
expect_code 1 "UNAUTHENTICATED" -- env GPUMOVE_TOKEN=wrong "$CTL" "${S[@]}" "${TLS[@]}" ls
C=$("$CTL" "${S[@]}" "${TLS[@]}" --token_file "$WORK/token" alloc 1MiB)
[[ "$C" == b-* ]] || fail "alloc with --token_file printed '$C'"
GPUMOVE_TOKEN=cli-token-0123456789 "$CTL" "${S[@]}" "${TLS[@]}" ls | grep -q "$C" \
  || fail "ls with GPUMOVE_TOKEN does not show $C"
"$CTL" "${S[@]}" "${TLS[@]}" --token_file "$WORK/token" info | grep -q "callers   bearer tokens" \
  || fail "info over the secure daemon does not say how callers are checked"
"$CTL" info | grep -q "callers   open, plaintext" || fail "info does not say the daemon is open"
# Health needs no credentials (probes carry none), but does need the transport's TLS.
expect_code 0 "SERVING" -- "$CTL" "${S[@]}" "${TLS[@]}" health
if [ ${#TLS[@]} -gt 0 ]; then
  expect_code 1 "UNAVAILABLE" -- "$CTL" "${S[@]}" --token_file "$WORK/token" ls  # Plaintext.
fi
echo "PASS"
