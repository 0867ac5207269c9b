"""The replay runner: recorded conversations replayed against an OpenAI-compatible server.

Runs on the client host (base dependencies only: no pandas). See docs/architecture.md section 6.
"""
