# A local SQS API: moto's server, in the background, on port 5000 (its log in moto.log).
pip install "moto[server]"
moto_server -H 127.0.0.1 -p 5000 > moto.log 2>&1 &
until python -c "import socket; socket.create_connection(('127.0.0.1', 5000), 1)" 2>/dev/null; do sleep 0.5; done

# The connection: moto takes any keys; endpoint_url sends the provider's calls to it.
export AIRFLOW_CONN_AWS_DEFAULT='{"conn_type": "aws", "login": "testing", "password": "testing",
  "extra": {"region_name": "us-east-1", "endpoint_url": "http://127.0.0.1:5000"}}'

# The queue. Put the URL it prints into QUEUE_URL of the quickstart Dag.
export QUEUE_URL=$(python -c '
import boto3
sqs = boto3.client("sqs", endpoint_url="http://127.0.0.1:5000", region_name="us-east-1",
                   aws_access_key_id="testing", aws_secret_access_key="testing")
print(sqs.create_queue(QueueName="orders")["QueueUrl"])
')
echo "QUEUE_URL=$QUEUE_URL"
