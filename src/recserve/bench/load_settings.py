"""How a sweep loads a server: the protocol, perf_analyzer's windows, threads and cores, the SLO it judges by,
what the requests carry (events by session, business rules), what the server traces and what is checked beside
the load. Every knob of ``recserve bench`` and ``benchmarks/serving_layouts.py`` is a field here, once: a field
with a help is an option of both (``recserve.cli.options``; ``option_fields.add_arguments``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from recserve.option_fields import option


@dataclass(frozen=True)
class LoadSettings:
    protocol: str = option(
        "grpc",
        "grpc, http, or grpc,http: every run made over each in turn, side by side (what Java and Go clients use "
        "beside the JSON one; the report gives http over grpc).",
    )
    measurement_ms: int = option(2000, "perf_analyzer measurement window (3 per level).")
    slo_p99_ms: float = option(50.0, "p99 latency objective for the best-within-SLO figure.")
    client_threads: int | None = option(
        None,
        "perf_analyzer threads keeping the requests in flight (async); default one per usable core, at most 16: "
        "on a shared host more threads than cores take CPU from the server.",
        min=1,
    )
    events_every: int = option(
        0,
        "By session: every Nth request also carries an event (an item to append before answering), a load of "
        "events and requests mixed; 0 for none.",
        min=0,
    )
    rules: str | None = option(
        None,
        "Business rules to load each layout under too, beside none (docs/rules.md), comma-separated: rule:NAME "
        "(a rule the repository stores), exclude:N or include:N (N catalogue items a request), hidden:PCT (that "
        "share of the catalogue hidden through the repository's store for those runs).",
    )
    trace_rate: int = option(
        0,
        "Triton traces one request in N (a server the bench starts, --repo): the report then says where the "
        "traced requests spent their time, stage by stage, and where the slowest hundredth spent it; 0 for none. "
        "Trace one in 20 or fewer: at one in 4 under load, Triton 2.51 failed some requests.",
        min=0,
    )
    keep_traces: bool = option(False, "With --trace-rate: keep Triton's trace files (traces/ in the report folder).")
    client_cpus: tuple[int, ...] = ()  # cores perf_analyzer is pinned to (the server keeps to the others); ()
    run_timeout_s: float | None = None  # one perf_analyzer run's limit (None: ten windows and a minute)
    compare_with_fused: bool = False  # check the native layout against the repository's fused one, if not swept

    def with_client_threads(self) -> LoadSettings:
        """These settings with ``client_threads`` decided: as given, else one per pinned core, else the default."""
        from recserve.bench.perf_analyzer import default_client_threads

        return replace(self, client_threads=self.client_threads or len(self.client_cpus) or default_client_threads())

    def protocols(self) -> tuple[str, ...]:
        """The protocols each run is made over, in order.

        Raises:
            ServingError: a word that is neither grpc nor http.
        """
        from recserve.errors import ServingError

        words = tuple(dict.fromkeys(w.strip() for w in self.protocol.split(",") if w.strip()))
        if not words or any(w not in ("grpc", "http") for w in words):
            raise ServingError(f"protocol {self.protocol!r}: expected grpc, http or grpc,http")
        return words

    def run_limit_s(self) -> float:
        return self.run_timeout_s or self.measurement_ms / 1000 * 10 + 60
