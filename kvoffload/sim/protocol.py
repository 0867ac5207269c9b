"""The wire contract between simulated engines and the simulated cache server.

The real LMCacheMPConnector talks ZMQ to `lmcache server`; the simulator keeps the same port
(`lmcache.mp.port`, default 5555) but speaks small JSON-over-HTTP messages, defined here so both
sides agree. Chunk keys are hex strings of `kvoffload.sim.hashing.chain_hashes` over 256-token
(`--chunk-size`) slices, seeded with the model name, so every engine computes the same keys.
Sizes are the modelled KV bytes of a chunk (`chunk_size * kv_bytes_per_token`).

    GET  /sim/ping                                   -> {"chunk_size": int}
    POST /sim/lookup   {model, keys, chunk_bytes}
                       -> {"hit_chunks": n, "l2_chunks": m}   (leading keys found; m of them came
                          from L2 and were prefetched into L1 before the answer; `keys` may be empty:
                          a prompt shorter than one chunk, which LMCache counts as an early exit)
    POST /sim/store    {model, keys, chunk_bytes}
                       -> {"stored": n}   (the engine copied these chunks out; n were new to L1)
    POST /sim/clear    {force}
                       -> {"cleared": n}  (the connector's CLEAR: empty L1, L2 stays; what
                          vLLM's `POST /reset_prefix_cache?reset_external=true` sends)
"""

from __future__ import annotations

PING = "/sim/ping"
LOOKUP = "/sim/lookup"
STORE = "/sim/store"
CLEAR = "/sim/clear"
