#!/bin/sh
# An agent for examples/review.yaml that takes a second per step, so a
# client can stop a thread while it runs (tests/mcp/test_mcp.py).
cat >/dev/null
sleep 1
case "$UWF_ROLE" in developer) s=review_needed ;; *) s=approved ;; esac
printf -- '---\n$status: %s\n---\nslow %s\n' "$s" "$UWF_ROLE"
