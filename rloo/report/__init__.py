"""The run report, a library output every run writes (``train()`` ends with ``report.html`` in the run folder;
``rloo report`` rebuilds it): ``page.py`` renders the one-page HTML report, ``plots.py`` its plots,
``diagnostics.py`` the findings read from the metrics; ``metric_names.py`` holds the metric names several
modules write or read, defined once. Torch-free: the report opens on a machine without torch."""
