"""SQS's errors as botocore and the other AWS SDKs read them (AWS JSON 1.0 with the
``awsQueryCompatible`` trait): status, a body ``{"__type": "com.amazonaws.sqs#<Shape>",
"message": ...}`` and the header ``x-amzn-query-error: <query code>;Sender``. botocore
raises the modelled exception named by the shape (``QueueDoesNotExist``...) with
``Error.Code`` the query code (``AWS.SimpleQueueService.NonExistentQueue``), as against
Amazon SQS."""

from __future__ import annotations

import orjson

# shape -> (HTTP status, query-protocol code)
CODES: dict[str, tuple[int, str]] = {
    "QueueDoesNotExist": (400, "AWS.SimpleQueueService.NonExistentQueue"),
    "QueueNameExists": (400, "QueueAlreadyExists"),
    "QueueDeletedRecently": (400, "AWS.SimpleQueueService.QueueDeletedRecently"),
    "BatchEntryIdsNotDistinct": (400, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    "TooManyEntriesInBatchRequest": (400,
                                     "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
    "EmptyBatchRequest": (400, "AWS.SimpleQueueService.EmptyBatchRequest"),
    "InvalidBatchEntryId": (400, "AWS.SimpleQueueService.InvalidBatchEntryId"),
    "BatchRequestTooLong": (400, "AWS.SimpleQueueService.BatchRequestTooLong"),
    "ReceiptHandleIsInvalid": (400, "ReceiptHandleIsInvalid"),
    "MessageNotInflight": (400, "AWS.SimpleQueueService.MessageNotInflight"),
    "PurgeQueueInProgress": (400, "AWS.SimpleQueueService.PurgeQueueInProgress"),
    "UnsupportedOperation": (400, "AWS.SimpleQueueService.UnsupportedOperation"),
    "InvalidAttributeName": (400, "InvalidAttributeName"),
    "InvalidAttributeValue": (400, "InvalidAttributeValue"),
    "InvalidMessageContents": (400, "InvalidMessageContents"),
    "ResourceNotFoundException": (404, "ResourceNotFoundException"),
    "RequestThrottled": (400, "RequestThrottled"),
    "OverLimit": (403, "OverLimit"),
    # common errors of every AWS service (not modelled: botocore raises ClientError)
    "InvalidParameterValue": (400, "InvalidParameterValue"),
    "MissingParameter": (400, "MissingParameter"),
    "InvalidAction": (400, "InvalidAction"),
    "MissingAuthenticationToken": (403, "MissingAuthenticationToken"),
    "InvalidClientTokenId": (403, "InvalidClientTokenId"),
    "SignatureDoesNotMatch": (403, "SignatureDoesNotMatch"),
    "IncompleteSignature": (400, "IncompleteSignature"),
    "RequestExpired": (400, "RequestExpired"),
    "AccessDenied": (403, "AccessDenied"),
    "InternalFailure": (500, "InternalFailure"),
    "ServiceUnavailable": (503, "ServiceUnavailable"),
}


class SqsError(Exception):
    """An SQS error answer. `shape`: a key of CODES."""

    def __init__(self, shape: str, message: str) -> None:
        super().__init__(message)
        assert shape in CODES, shape
        self.shape = shape
        self.message = message
        self.status, self.query_code = CODES[shape]

    @property
    def sender_fault(self) -> bool:
        return self.status < 500

    def body(self) -> bytes:
        return orjson.dumps({"__type": f"com.amazonaws.sqs#{self.shape}",
                             "message": self.message})

    def headers(self) -> list[tuple[bytes, bytes]]:
        fault = "Sender" if self.sender_fault else "Receiver"
        return [(b"x-amzn-query-error", f"{self.query_code};{fault}".encode()),
                (b"content-type", b"application/x-amz-json-1.0")]

    def entry(self, entry_id: str) -> dict[str, object]:
        """A batch answer's ``Failed`` entry."""
        return {"Id": entry_id, "SenderFault": self.sender_fault,
                "Code": self.query_code, "Message": self.message}


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)
