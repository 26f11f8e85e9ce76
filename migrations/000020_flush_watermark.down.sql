DROP TABLE flush_watermark;
