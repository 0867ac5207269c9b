#!/usr/bin/python3
"""GET http://127.0.0.1:8100/who once per argument, as that user (X-User-Id: user-<arg>; "-" sends no
header), in order; prints the replies' bodies as a JSON list. One task for many requests: a uri loop
cost the caddy scenario a second per request."""
import json
import sys
import urllib.request

bodies = []
for user in sys.argv[1:]:
    headers = {} if user == "-" else {"X-User-Id": f"user-{user}"}
    request = urllib.request.Request("http://127.0.0.1:8100/who", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as reply:
        bodies.append(reply.read().decode())
print(json.dumps(bodies))
