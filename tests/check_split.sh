#!/bin/sh
# tests/check_split.sh CHECK SUITES: runs the Check binary CHECK as two processes at once, one for
# the comma-separated SUITES (CHECK_SUITES) and one for every other suite (CHECK_SKIP_SUITES), so
# that a run whose suites each keep about one core busy (the sanitized one) takes both cores.
# Prints each process's output whole, the listed suites' first, and fails if either fails.
set -u
check=$1
split=$2
out=$(mktemp -d /tmp/attnd-check-split.XXXXXX) || exit 1
CHECK_SUITES=$split "$check" >"$out/listed" 2>&1 &
listed=$!
CHECK_SKIP_SUITES=$split "$check" >"$out/rest" 2>&1
rest=$?
wait "$listed"
listed=$?
cat "$out/listed" "$out/rest"
rm -rf "$out"
[ "$listed" -eq 0 ] && [ "$rest" -eq 0 ]
