DROP TABLE IF EXISTS {{.BinlogPosition}};
