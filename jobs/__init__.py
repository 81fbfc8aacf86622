"""Fine-tuning jobs run in the background: a SQLite-backed queue (:mod:`jobs.store`), a worker that runs each
job in its own process (:mod:`jobs.worker`, :mod:`jobs.run`) and submit-time validation (:mod:`jobs.submit`).
No streamlit here: the dashboard and the CLI both use these."""
