"""Users, projects and who may do what in a project."""
