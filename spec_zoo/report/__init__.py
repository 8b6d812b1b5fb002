"""``spec-zoo-report``: one or many benchmark results files -> a markdown report with PNG plots."""

from spec_zoo.report.build import build_report, find_results, load_results  # noqa: F401
