-- wrk script of the router bench: sends "Connection: close" on every request when
-- ZL_BENCH_CONNECTION=close (wrk then opens a new connection per request), and prints
-- one machine-readable summary line at the end.
if os.getenv("ZL_BENCH_CONNECTION") == "close" then
  wrk.headers["Connection"] = "close"
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'ZL_BENCH_RESULT {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"mean": %.1f, "p50": %d, "p90": %d, "p99": %d, "max": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
