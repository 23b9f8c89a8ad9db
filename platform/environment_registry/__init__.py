"""Environments registered in a project, which runs train against."""
