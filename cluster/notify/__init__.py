"""`quorumgate notify`: open confirmation cards announced to their principal by webhook and
e-mail (docs/notifications.md). A notification only tells; answering a card needs the
principal's own key, in the console or `quorumgate confirm`."""
