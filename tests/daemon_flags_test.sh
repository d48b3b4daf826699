#!/bin/bash
# The daemons' configuration errors: one line naming the bad value, exit status 2; environment
# variables (TESSERA_* and PADDLE_*) are read, and an explicit flag wins over them.
set -u
PS="$TEST_SRCDIR/tessera/pserver/tessera_pserver"
TR="$TEST_SRCDIR/tessera/trainer/tessera_trainer"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
# shellcheck source=tests/cli_test_lib.sh
source "$TEST_SRCDIR/tessera/tests/cli_test_lib.sh"
check() { expect_exit "$@"; }
check 2 "--trainers='zero'" "$PS" --trainers=zero
check 2 "unknown flag --frobnicate" "$TR" --frobnicate=1
check 2 "--split_method='random'" "$TR" --pservers=127.0.0.1:1 --split_method=random
check 2 "is not in --pservers" "$PS" --pservers=127.0.0.1:7000 --current_endpoint=127.0.0.1:7001
check 2 "'nohost' is not host:port" "$TR" --pservers=nohost
check 2 "PADDLE_TRAINERS_NUM='x'" env PADDLE_TRAINERS_NUM=x "$TR" --pservers=127.0.0.1:1
check 2 "--trainer_id=3 must be < --trainers=2" env PADDLE_TRAINER_ID=3 PADDLE_TRAINERS_NUM=2 \
  "$TR" --pservers=127.0.0.1:1
# An explicit flag wins over the environment (the environment's value would be valid).
check 2 "--current_endpoint='bad'" env PADDLE_CURRENT_ENDPOINT=127.0.0.1:7000 \
  "$PS" --pservers=127.0.0.1:7000 --current_endpoint=bad
# TESSERA_* wins over PADDLE_*.
check 2 "--trainer_id=7 must be < --trainers=2" env TESSERA_TRAINER_ID=7 PADDLE_TRAINER_ID=0 \
  "$TR" --pservers=127.0.0.1:1 --trainers=2
check 2 "(this binary is the trainer)" env PADDLE_TRAINING_ROLE=PSERVER \
  "$TR" --pservers=127.0.0.1:1 --current_endpoint=127.0.0.1:1
"$PS" --help | grep -q "PADDLE_PSERVERS_IP_PORT_LIST" || fail "--help"
finish
