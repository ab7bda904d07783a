#!/bin/bash
# cli_nofs.sh — the federated launch with no filesystem in common between
# the sites, and the name server (ompi-server) going away, real processes
# of tiny.ini through scripts/federated.sh (jobs/README.md, "No shared
# filesystem", "When ompi-server restarts"):
#  - the server given by value: `federated.sh uri HOST:PORT` asks the
#    server its name and gives its URI (the one it wrote), `check` answers
#    for HOST:PORT, the URI and its file, and not for a closed port;
#  - two sites in directories of their own (out_dir, checkpoints, a copy
#    of the key made once): a given the URI itself, b HOST:PORT; they meet,
#    train and end on the same model, and no file of either lies in the
#    other's directory or the server's; each site's log names its rank's
#    device ("device: rank 0: host H (local rank 0 of 1), cpu");
#  - the server stopped at step 100, no site leaving: both sites train to
#    the end, exit 0 (without the watch, the host never exited);
#  - the server started again at its port (a new name), then site b killed:
#    the host says the name service went away, trains on alone to the end
#    and writes the model (without the watch its mpirun ended at once);
#    the URI of the old server is refused in one line; b given HOST:PORT
#    finds the new server, which does not know the run: it gives up at its
#    join_timeout;
#  - a site waiting for the other when the server starts again: it exits
#    3, federated.sh starts it again at the new server, and the run forms
#    there when b comes.
. "$TOP_SRCDIR/tests/lib.sh"
FED="$TOP_SRCDIR/scripts/federated.sh"
export ISTHMUS MPIRUN_ARGS="-q --oversubscribe"
T="$CONFIGS/tiny.ini"
PORT=23800
export ISTHMUS_SERVER_WAIT=60
RUN="--set site.a.ranks=1 --set site.b.ranks=1 --set outer.mode=diloco --set outer.inner_steps=4
--set data.eval_bytes=4096 --set outer.timeout=5 --set train.log_every=50 --set checkpoint.every=100"
SERVER="$WORK/server"
server() { ISTHMUS_PORTS=$PORT-$((PORT + 23)) "$FED" server "$SERVER"; }
trap '"$FED" stop "$SERVER"; rm -rf "$WORK"' EXIT
server || { fail "ompi-server did not start on port $PORT"; finish; exit 1; }
URI=$(cat "$SERVER/ompi-server.uri")

# site NAME DIR SERVER LOG [args...]: one site in its own directory, in the background (pid in $!)
site() {
    local name=$1 dir=$2 server=$3 log=$4
    shift 4
    # shellcheck disable=SC2086
    timeout 300 "$FED" site "$server" "$name" 1 "$T" $RUN --set train.out_dir="$dir" \
        --set outer.key_file="$dir/run.key" "$@" > "$log" 2>&1 &
}
wait_line() { # wait_line FILE PATTERN SECONDS
    local n=0
    until grep -q "$1" -e "$2" 2> /dev/null; do
        n=$((n + 1))
        [ $n -gt $(($3 * 5)) ] && return 1
        sleep 0.2
    done
}
keys() { # keys A B: a key made once at A, copied to B (mode 0600 kept)
    mkdir -p "$1" "$2" && "$ISTHMUS" keygen "$1/run.key" > /dev/null && cp -p "$1/run.key" "$2/run.key"
}

# 1. the server by value
got=$("$FED" uri "127.0.0.1:$PORT" 2> "$WORK/uri.err")
if [ "$got" = "${URI%%;*};tcp://127.0.0.1:$PORT" ]; then
    pass "federated.sh uri 127.0.0.1:$PORT asks the server its name: $got"
else
    fail "federated.sh uri HOST:PORT gave '$got' for the server of '$URI': $(cat "$WORK/uri.err")"
fi
[ "$("$FED" uri "$URI")" = "$URI" ] && pass "federated.sh uri URI: the URI itself, checked" || fail "uri of the URI itself"
ok=1
for s in "127.0.0.1:$PORT" "localhost:$PORT" "$URI" "$SERVER/ompi-server.uri"; do "$FED" check "$s" || ok=0; done
"$FED" check "127.0.0.1:9" && ok=0
[ $ok = 1 ] && pass "federated.sh check: HOST:PORT, the URI and its file answer; a closed port does not" ||
    fail "federated.sh check of the server's forms"
expect_exit 2 "ompi-server at 127.0.0.1:9 \(tcp://127.0.0.1:9\) does not answer: is it running" -- \
    "$FED" site 127.0.0.1:9 a 1 "$T"

# 2. two sites, nothing in common but the network
keys "$WORK/A" "$WORK/B"
site a "$WORK/A" "$URI" "$WORK/meet_a.log" --set train.steps=40 --set outer.run_id=nofs-meet --set outer.join_timeout=120
pa=$!
site b "$WORK/B" "127.0.0.1:$PORT" "$WORK/meet_b.log" --set train.steps=40 --set outer.run_id=nofs-meet \
    --set outer.join_timeout=120
pb=$!
wait $pa
ra=$?
wait $pb
rb=$?
fa="$WORK/A/checkpoints/a/ckpt-00000040.h5"
fb="$WORK/B/checkpoints/b/ckpt-00000040.h5"
# the only files of a site are under its own directory (and nothing in the server's but its own)
foreign=$(find "$WORK/A" -path '*/b/*' -o -name 'site-b'; find "$WORK/B" -path '*/a/*')
for f in "$SERVER"/*; do
    case ${f##*/} in ompi-server.uri | ompi-server.pid | ompi-server.log) ;; *) foreign="$foreign $f" ;; esac
done
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -f "$WORK/A/model.h5" ] && [ -f "$fa" ] && [ -f "$fb" ] &&
    h5diff "$fa" "$fb" /model /model > /dev/null 2>&1 && [ -z "$foreign" ] &&
    grep -q "^federation: site b joined (proof verified)" "$WORK/meet_a.log"; then
    pass "sites in directories of their own, a given the URI, b HOST:PORT, one key copied: they meet and end on the same model"
else
    fail "meeting by value: exits $ra/$rb, foreign files '$foreign': $(grep -h 'error\|federated.sh' "$WORK"/meet_?.log | head -3 | tr '\n' '|')"
fi
if grep -Eq "^device: rank 0: host [^ ]+ \(local rank 0 of 1\), cpu$" "$WORK/meet_a.log" &&
    grep -Eq "^device: rank 0: host [^ ]+ \(local rank 0 of 1\), cpu$" "$WORK/meet_b.log"; then
    pass "each site's log names its rank's device: $(grep -m1 '^device:' "$WORK/meet_b.log")"
else
    fail "no device line: $(grep -h '^device' "$WORK"/meet_?.log | head -2 | tr '\n' '|')"
fi

# 3. the server stopped mid-run, no site leaving: both train to the end
keys "$WORK/C" "$WORK/D"
site a "$WORK/C" "127.0.0.1:$PORT" "$WORK/gone_a.log" --set train.steps=600 --set outer.run_id=nofs-gone
pa=$!
site b "$WORK/D" "127.0.0.1:$PORT" "$WORK/gone_b.log" --set train.steps=600 --set outer.run_id=nofs-gone
pb=$!
wait_line "$WORK/gone_a.log" '^step  *100/' 120 && "$FED" stop "$SERVER"
wait $pa
ra=$?
wait $pb
rb=$?
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -f "$WORK/C/model.h5" ] && grep -q "^step  *600/600" "$WORK/gone_b.log" &&
    grep -q "^federation: the name service (ompi-server at 127.0.0.1:$PORT) went away" "$WORK/gone_a.log"; then
    pass "ompi-server stopped at step 100: both sites train to step 600 and exit 0; the host says it went away"
else
    fail "server gone mid-run: exits $ra/$rb: $(grep -h 'error\|name service\|federated.sh' "$WORK"/gone_?.log | head -3 | tr '\n' '|')"
fi

# 4. the server started again at its port (a new name), then site b killed
server || fail "ompi-server did not start again"
URI=$(cat "$SERVER/ompi-server.uri")
keys "$WORK/E" "$WORK/F"
site a "$WORK/E" "127.0.0.1:$PORT" "$WORK/again_a.log" --set train.steps=1200 --set outer.run_id=nofs-again
pa=$!
site b "$WORK/F" "127.0.0.1:$PORT" "$WORK/again_b.log" --set train.steps=1200 --set outer.run_id=nofs-again
pb=$!
wait_line "$WORK/again_a.log" '^step  *100/' 120 && "$FED" stop "$SERVER" && sleep 1 && server
wait_line "$WORK/again_a.log" '^step  *300/' 120
pkill -KILL -f "isthmus train .* --site b .*outer.run_id=nofs-again( |$)"
wait $pb
wait_line "$WORK/again_a.log" '^site b lost at step' 60
expect_exit 2 "the ompi-server at .* is not the one .* names \(its name is [0-9.]*, not ${URI%%;*}: started again since\?\)" -- \
    "$FED" site "$URI" b 1 "$T"
site b "$WORK/F" "127.0.0.1:$PORT" "$WORK/again_b2.log" --set train.steps=1200 --set outer.run_id=nofs-again \
    --set outer.join_timeout=10 --resume auto
pb=$!
wait $pa
ra=$?
wait $pb
rb=$?
if [ -f "$WORK/E/model.h5" ] && grep -q "^step  *1200/1200" "$WORK/again_a.log" &&
    grep -q "^federation: the name service (ompi-server at 127.0.0.1:$PORT) went away" "$WORK/again_a.log" &&
    grep -q "^federation: site a cannot host" "$WORK/again_a.log"; then
    pass "ompi-server started again, then b lost: the host leaves the name service alone and trains on to the end (its mpirun exit $ra)"
else
    fail "server started again, b lost: a exit $ra: $(grep -h 'error\|name service\|federated.sh\|unexpected' "$WORK/again_a.log" | head -3 | tr '\n' '|')"
fi
grep -q "^federated.sh: site a: mpirun exit $ra, and the ompi-server it was given .* is gone or was started again" \
    "$WORK/again_a.log" && [ $ra -ne 0 ] && pass "its mpirun ends with exit $ra, and federated.sh says why" ||
    note "a's mpirun ended with exit $ra (Open MPI 4.1.4 ends it with 1 here)"
if [ $rb -eq 1 ] && grep -q "the name service does not know: no host isthmus-nofs-again within 10 s" "$WORK/again_b2.log"; then
    pass "b started again finds the new server by HOST:PORT, which does not know the run: it gives up at its join_timeout"
else
    fail "b started again: exit $rb: $(grep -h 'error' "$WORK/again_b2.log" | head -2 | tr '\n' '|')"
fi

# 5. a site waiting for the other when the server starts again
keys "$WORK/G" "$WORK/H"
site a "$WORK/G" "127.0.0.1:$PORT" "$WORK/wait_a.log" --set train.steps=40 --set outer.run_id=nofs-wait \
    --set outer.join_timeout=0 --resume auto
pa=$!
wait_line "$WORK/wait_a.log" 'waiting for site(s) b' 60 && "$FED" stop "$SERVER" && sleep 1 && server
wait_line "$WORK/wait_a.log" 'federated.sh: site a was dropped from the run or its join broke (exit 3)' 150 &&
    wait_line "$WORK/wait_a.log" 'hosts run nofs-wait; waiting' 90
site b "$WORK/H" "127.0.0.1:$PORT" "$WORK/wait_b.log" --set train.steps=40 --set outer.run_id=nofs-wait \
    --set outer.join_timeout=0 --resume auto
pb=$!
wait $pa
ra=$?
wait $pb
rb=$?
if [ $ra -eq 0 ] && [ $rb -eq 0 ] && [ -f "$WORK/G/model.h5" ] && [ "$(grep -c 'hosts run nofs-wait; waiting' "$WORK/wait_a.log")" = 2 ]; then
    pass "a site waiting when ompi-server starts again exits 3, is started again at the new server, and the run forms there"
else
    fail "waiting site, server started again: exits $ra/$rb: $(grep -h 'error\|federated.sh' "$WORK"/wait_?.log | head -4 | tr '\n' '|')"
fi
finish || exit 1
