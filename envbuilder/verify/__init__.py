"""`envbuilder verify`: run the smoke suite (in an image or on the host) and report.

``cli.add_arguments`` / ``cli.run`` are what the top-level command line wires in; ``runner``
builds and runs the command lines; ``report`` prints the table and writes JSON / JUnit.
"""
