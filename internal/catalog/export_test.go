package catalog

import (
	"context"

	"github.com/tollgate/tollgate/internal/postgres"
)

func storeExec(s *postgres.Store, sql string, args ...any) (int64, error) {
	tag, err := s.Pool().Exec(context.Background(), sql, args...)
	return tag.RowsAffected(), err
}
