"""The outcome of a measured case or a task run, as stored and as shown in tables."""

OK, OOM, ERROR, SKIPPED = "ok", "oom", "error", "skipped"
INVALID = "invalid"  # it ran, but its output broke the contract (shape, dtype, NaN, wrong values)
TIMEOUT = "timeout"  # predicted past the time limit (not run), or stopped past --timeout
STATUSES = (OK, OOM, ERROR, SKIPPED, INVALID, TIMEOUT)
# How a case without a number is shown in a table cell.
STATUS_TEXT = {
    OK: "ok",
    OOM: "OOM",
    ERROR: "error",
    SKIPPED: "n/a",
    INVALID: "invalid",
    TIMEOUT: "timeout",
}
