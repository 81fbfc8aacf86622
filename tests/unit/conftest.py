"""The unit tier: one module's functions against a straightforward computation (scikit-learn, scipy, plain
transformers) on tiny models and planted data; no door (CLI, job process, page) is run. Shared helpers are in
tests/support; the fixtures every tier uses are in tests/conftest.py."""
