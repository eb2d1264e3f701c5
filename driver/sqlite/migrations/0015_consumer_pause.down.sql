-- Forgets the pauses: every paused consumer and relay runs again.
DROP TABLE {{.ConsumerPause}};
