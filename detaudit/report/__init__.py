"""The audit's result as data (model) and the files made of it: JSON, JUnit, HTML, baselines."""
