# A local Kafka-protocol broker from PyPI: noida-db, in the background, on port 9092.
pip install noida-db
noida-db start --data-dir kafka-data --host 127.0.0.1 --only kafka --kafka-port 9092 > kafka.log 2>&1 &
until python -c "import socket; socket.create_connection(('127.0.0.1', 9092), 1)" 2>/dev/null; do sleep 0.5; done

# The connection: the broker's address, as the Kafka provider's connection has it.
export AIRFLOW_CONN_KAFKA_DEFAULT='{"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:9092"}}'

# The topic (the stream never creates one): three partitions.
python -c '
import asyncio
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

async def create():
    admin = AIOKafkaAdminClient(bootstrap_servers="127.0.0.1:9092")
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", num_partitions=3, replication_factor=1)])
    finally:
        await admin.close()

asyncio.run(create())
'
