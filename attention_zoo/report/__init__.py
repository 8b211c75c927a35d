"""Reports: stored results -> Markdown tables and PNG plots (pandas + seaborn)."""

from .builder import ReportFiles, build_report, variant_label

__all__ = ["ReportFiles", "build_report", "variant_label"]
