"""A Django app of the tests' own: the models the ORM hook tests track."""
