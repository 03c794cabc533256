"""`detaudit fix`: the smallest set of settings that makes a script's repeats agree, as code, verified and
costed (docs/fix.md). An experiment here is an audit of the script as the user would change it."""
