DROP TABLE worker_marks;
