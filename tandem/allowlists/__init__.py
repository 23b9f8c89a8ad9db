"""The operator's allow-lists: which model and dataset files, environment URLs and modules user input may name.

Read by the platform when it accepts a registration and again by the processes that act on it.
"""
