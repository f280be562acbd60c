#!/usr/bin/env python3
"""Reads JSON values (one per line, or one document) on stdin and prints
each with its keys sorted: what two answers equal as JSON values print
the same. Lines that are not JSON are printed as they are."""
import json, sys
text = sys.stdin.read()
try:
    print(json.dumps(json.loads(text), sort_keys=True))
except ValueError:
    for line in text.splitlines():
        try:
            print(json.dumps(json.loads(line), sort_keys=True))
        except ValueError:
            print(line)
