"""The SQS-compatible endpoint of a data node (docs/sqs.md): AWS JSON 1.0 at ``POST /``,
signed with AWS Signature Version 4, onto squall's queues (decision 0030)."""
