"""A finished run as one self-contained HTML file (``docs/report.md``): its figures (plotly.js inlined once), the
first rows of its tables, its files embedded for download, its model, options, versions and the command line that
reproduces it. Nothing in the file asks any host for anything; every text from the data is escaped.

:mod:`analysis.report.html` assembles the page (:func:`~analysis.report.html.build_report`,
:func:`~analysis.report.html.write_report`), :mod:`analysis.report.command` rebuilds the command line and
:mod:`analysis.report.figures` draws the generic figures (a numeric column against ``layer``); the per-task figures
come from the task layer (:mod:`analysis.tasks.report`), which may import the techniques' ``plots``."""
