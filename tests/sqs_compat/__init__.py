"""Other projects' SQS clients and test suites run against squall's SQS endpoint.

Each client comes from its own registry at test time (PyPI extras, npm, moto's source
distribution); none of their code is copied into this repository."""
