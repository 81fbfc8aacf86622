"""The layer atlas' option choices, importable without torch (the CLI's parser is built from them)."""

COLOR_BY = ("label", "prediction", "correct")  # a classifier's own predictions can colour the atlas
