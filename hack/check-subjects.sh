#!/usr/bin/env bash
# Fails when a commit subject is longer than 72 characters (CONTRIBUTING:
# "Commit subjects: area: imperative summary, at most 72 characters").
# Commits up to and including $KVNET_SUBJECTS_SINCE (default: the last
# commit before this check was added) are history and are not checked.
# Run from the repository to check (make verify runs it).
set -euo pipefail
since=${KVNET_SUBJECTS_SINCE:-93c3efa58a0c2da385c32e44c036ba3d7a395fcb}
max=72
# Commits after the base that landed before the check ran on every merge,
# each named with its length; no commit may be added here.
known="1b60d8b5"
if git cat-file -e "$since^{commit}" 2>/dev/null; then
  range="$since..HEAD"
else
  # A shallow clone without that commit: check what it has.
  echo "check-subjects: $since not in this clone; checking HEAD only" >&2
  range="-1 HEAD"
fi
# shellcheck disable=SC2086
long=$(git log --format='%h %s' --abbrev=8 $range | awk -v max=$max -v known="$known" '
  BEGIN { n = split(known, k, " "); for (i = 1; i <= n; i++) skip[k[i]] = 1 }
  { s = substr($0, index($0, " ") + 1) }
  length(s) > max && !(substr($1, 1, 8) in skip) { printf "%s (%d characters)\n", $0, length(s) }')
if [ -n "$long" ]; then
  echo "commit subjects over $max characters (say the rest in the body):"
  echo "$long"
  exit 1
fi
