"""Real-time sessions: each shopper's recent items kept in a Redis-protocol store (Valkey or Redis), events
in, the latest of a session out. The core needs redis-py only; serving and the CLI are shells around it."""
