"""The only package besides app.py and pages/ that imports streamlit: shared widgets and cached resources."""
