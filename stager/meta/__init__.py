"""The metadata server: namespace, layouts, targets."""
