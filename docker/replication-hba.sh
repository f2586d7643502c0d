#!/bin/sh
# Run once by the postgres image when its data volume is new: let streaming replicas (the
# optional postgres-replica service, README "Beyond one machine") connect for replication.
echo "host replication all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
