"""The operator's surface: the admin API, its views and time parsing, the CLI."""
