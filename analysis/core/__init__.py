"""What two techniques or more share (docs/architecture.md): it imports only itself and ``models``."""
