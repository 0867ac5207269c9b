"""`kvoffload-lab sim serve|cache-server`: the GPU-free stand-ins for `vllm serve` and `lmcache server`.

Everything after the sub-command is handed, unparsed, to the simulator's own copies of the vLLM and
LMCache command lines (`kvoffload.sim.engine_args`, `kvoffload.sim.cache_args`), so role templates pass
the same flags to the simulator as to the real binaries.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="simulated vLLM engine and LMCache server (no GPU needed)",
        description="GPU-free stand-ins for `vllm serve` and `lmcache server` (docs/simulator.md).",
    )
    sub = parser.add_subparsers(dest="sim_command", metavar="SIM_COMMAND", required=True)
    serve = sub.add_parser(
        "serve",
        help="simulated `vllm serve MODEL [flags] [--sim-profile NAME|PATH]`",
        add_help=False,
        prefix_chars="\x00",  # every token, --help included, goes to the vLLM-style parser
    )
    serve.add_argument("vllm_args", nargs=argparse.REMAINDER)
    serve.set_defaults(func=_serve)
    cache = sub.add_parser(
        "cache-server",
        help="simulated `lmcache server [flags] [--sim-profile NAME|PATH] [--sim-l2-scale N]`",
        add_help=False,
        prefix_chars="\x00",
    )
    cache.add_argument("lmcache_args", nargs=argparse.REMAINDER)
    cache.set_defaults(func=_cache_server)


def _serve(args: argparse.Namespace) -> int:
    from kvoffload.sim.engine_args import parse_engine_args
    from kvoffload.sim.engine_server import serve

    return serve(parse_engine_args(list(args.vllm_args)))


def _cache_server(args: argparse.Namespace) -> int:
    from kvoffload.sim.cache_args import parse_cache_args
    from kvoffload.sim.cache_server import serve_cache

    return serve_cache(parse_cache_args(list(args.lmcache_args)))
