"""Reports: stored results -> report.md + self-contained report.html (pandas + seaborn)."""

from .builder import ReportFiles, build_report

__all__ = ["ReportFiles", "build_report"]
