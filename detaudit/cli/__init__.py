"""The terminal front end: click commands, options, the session, rich rendering."""
