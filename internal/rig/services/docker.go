package services

import (
	"context"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
)

// redisContainer starts Redis in Docker. This path runs only where Docker
// answers; fencekit's CI machines have no Docker engine, so it is not
// exercised there.
func redisContainer(ctx context.Context) (string, func(), error) {
	c, err := tcredis.Run(ctx, "redis:7-alpine")
	if err != nil {
		return "", nil, err
	}
	stop := func() { _ = testcontainers.TerminateContainer(c) }
	url, err := c.ConnectionString(ctx)
	if err != nil {
		stop()
		return "", nil, err
	}
	return url, stop, nil
}

// postgresContainer starts PostgreSQL in Docker (see redisContainer).
func postgresContainer(ctx context.Context) (string, func(), error) {
	c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
		tcpostgres.WithDatabase("test"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		return "", nil, err
	}
	stop := func() { _ = testcontainers.TerminateContainer(c) }
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		stop()
		return "", nil, err
	}
	return url, stop, nil
}
